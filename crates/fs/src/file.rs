//! [`File`]: an open file for programs that embed quill, like `std::fs::File` with
//! positional I/O. It keeps the inode open (an unlinked file stays readable until the last
//! handle closes) and closes it when dropped.

use std::sync::Arc;

use crate::data::FallocateMode;
use crate::error::Result;
use crate::filesystem::Filesystem;
use crate::inodes::InodeSlot;
use crate::ops::{Attr, SetAttr};

/// An open file of a [`Filesystem`].
///
/// ```
/// # use std::sync::Arc;
/// # use blockdev::{memory::MemDevice, BlockDevice};
/// # use fs::{Filesystem, MountOptions, ROOT_INO};
/// # let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(32 << 20));
/// # fs::mkfs::mkfs(dev.as_ref(), &fs::mkfs::MkfsOptions { device_zeroed: true, ..Default::default() })?;
/// let fs = Filesystem::open(dev, MountOptions::default())?;
/// let file = fs.create_file(ROOT_INO, b"log", 0o644)?;
/// file.write_at(0, b"first line\n")?;
/// file.sync_all()?;
/// let mut buf = vec![0u8; 64];
/// let n = fs.open_path("/log")?.read_at(0, &mut buf)?;
/// assert_eq!(&buf[..n], b"first line\n");
/// # drop(file);
/// # fs.unmount()?;
/// # Ok::<(), fs::FsError>(())
/// ```
pub struct File<'fs> {
    fs: &'fs Filesystem,
    slot: Arc<InodeSlot>,
}

impl Filesystem {
    /// Opens inode `ino`.
    pub fn open_file(&self, ino: u32) -> Result<File<'_>> {
        Ok(File { fs: self, slot: self.open_inode(ino)? })
    }

    /// Opens the file at absolute `path`.
    pub fn open_path(&self, path: &str) -> Result<File<'_>> {
        self.open_file(self.resolve(path)?)
    }

    /// Creates regular file `name` in directory `parent` (owned by root) and opens it.
    pub fn create_file(&self, parent: u32, name: &[u8], mode: u16) -> Result<File<'_>> {
        let attr = self.create(parent, name, mode, 0, 0)?;
        self.open_file(attr.ino)
    }
}

impl File<'_> {
    pub fn ino(&self) -> u32 {
        self.slot.ino
    }

    /// Reads at `offset`; returns how many bytes (0 at end of file).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.fs.read(self.ino(), offset, buf)
    }

    /// Writes at `offset`; returns how many bytes were written (fewer only when the file
    /// system filled up).
    pub fn write_at(&self, offset: u64, bytes: &[u8]) -> Result<usize> {
        self.fs.write(self.ino(), offset, bytes)
    }

    /// Reads the whole file.
    pub fn read_to_end(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.metadata()?.size as usize];
        let mut done = 0;
        while done < out.len() {
            let n = self.read_at(done as u64, &mut out[done..])?;
            if n == 0 {
                break;
            }
            done += n;
        }
        out.truncate(done);
        Ok(out)
    }

    pub fn metadata(&self) -> Result<Attr> {
        self.fs.getattr(self.ino())
    }

    /// Truncates or extends the file to `size` bytes.
    pub fn set_len(&self, size: u64) -> Result<()> {
        self.fs.setattr(self.ino(), &SetAttr { size: Some(size), ..SetAttr::default() })?;
        Ok(())
    }

    pub fn allocate(&self, mode: FallocateMode, offset: u64, len: u64) -> Result<()> {
        self.fs.fallocate(self.ino(), mode, offset, len)
    }

    /// fsync: the data and every change to the inode (and, for a new file, its name) durable.
    pub fn sync_all(&self) -> Result<()> {
        self.fs.fsync(self.ino(), false)
    }

    /// fdatasync: the data and what is needed to read it back durable.
    pub fn sync_data(&self) -> Result<()> {
        self.fs.fsync(self.ino(), true)
    }
}

impl Drop for File<'_> {
    fn drop(&mut self) {
        // Closing frees an unlinked inode; an error there has turned the file system
        // read-only already (`Filesystem::fail`), and the orphan list finishes the job at the
        // next mount.
        let _ = self.fs.close_inode(&self.slot);
    }
}

impl std::fmt::Debug for File<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File").field("ino", &self.slot.ino).finish()
    }
}
