//! The file-system interface the workloads are written against, so one workload runs
//! unchanged on quill in-process ([`LibApi`]) and on any mounted directory ([`PosixApi`]:
//! quill through FUSE, the kernel's ext4, fuse2fs, anything else).
//!
//! Paths are relative to the target's root and use `/` separators (`varmail/t3/f17`).
//! Files are opened read-write; [`FsApi::create`] is an exclusive create (the workloads only
//! create names they know are free), and an [`OpenFile`] closes when dropped.

use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fs::{Filesystem, FsError, InodeSlot, ROOT_INO};

/// A file system the workloads can drive.
pub trait FsApi: Send + Sync {
    fn mkdir(&self, path: &str) -> io::Result<()>;
    /// Creates `path` (it must not exist) and opens it read-write.
    fn create(&self, path: &str) -> io::Result<Box<dyn OpenFile>>;
    /// Opens the existing file `path` read-write.
    fn open(&self, path: &str) -> io::Result<Box<dyn OpenFile>>;
    fn unlink(&self, path: &str) -> io::Result<()>;
    /// stat(2) of `path`: its size in bytes.
    fn stat(&self, path: &str) -> io::Result<u64>;
    /// Makes everything written so far durable (sync(2) scoped to this file system).
    fn sync(&self) -> io::Result<()>;
}

/// An open file; closed when dropped.
pub trait OpenFile: Send {
    /// Writes all of `data` at `offset`.
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Reads at `offset`; returns how many bytes (0 at end of file).
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
    /// The file's size in bytes.
    fn size(&mut self) -> io::Result<u64>;
    fn fsync(&mut self) -> io::Result<()>;
    fn fdatasync(&mut self) -> io::Result<()>;
}

/// Reads a whole file in `chunk`-byte reads (filebench's readwholefile); returns the bytes read.
pub fn read_whole(file: &mut dyn OpenFile, chunk: &mut [u8]) -> io::Result<u64> {
    let mut offset = 0u64;
    loop {
        let n = file.read_at(offset, chunk)?;
        if n == 0 {
            return Ok(offset);
        }
        offset += n as u64;
    }
}

// ---------------------------------------------------------------------------------------------
// quill in-process

/// quill's [`Filesystem`] called directly: no kernel, no FUSE, the engine alone.
pub struct LibApi {
    fs: Arc<Filesystem>,
}

impl LibApi {
    pub fn new(fs: Arc<Filesystem>) -> LibApi {
        LibApi { fs }
    }

    /// The parent directory's inode and the last component of `path`.
    fn parent_of<'p>(&self, path: &'p str) -> io::Result<(u32, &'p [u8])> {
        let path = path.trim_matches('/');
        match path.rsplit_once('/') {
            Some((dir, name)) => Ok((self.resolve(dir)?, name.as_bytes())),
            None => Ok((ROOT_INO, path.as_bytes())),
        }
    }

    fn resolve(&self, path: &str) -> io::Result<u32> {
        self.fs.resolve(&format!("/{}", path.trim_matches('/'))).map_err(io_error)
    }

    fn open_ino(&self, ino: u32) -> io::Result<Box<dyn OpenFile>> {
        let slot = self.fs.open_inode(ino).map_err(io_error)?;
        Ok(Box::new(LibFile { fs: self.fs.clone(), ino, slot }))
    }
}

/// An [`FsError`] as the errno a system call would have returned, keeping its message.
pub fn io_error(err: FsError) -> io::Error {
    let kind = io::Error::from_raw_os_error(err.errno()).kind();
    io::Error::new(kind, err.to_string())
}

impl FsApi for LibApi {
    fn mkdir(&self, path: &str) -> io::Result<()> {
        let (parent, name) = self.parent_of(path)?;
        self.fs.mkdir(parent, name, 0o755, 0, 0).map(drop).map_err(io_error)
    }

    fn create(&self, path: &str) -> io::Result<Box<dyn OpenFile>> {
        let (parent, name) = self.parent_of(path)?;
        let attr = self.fs.create(parent, name, 0o644, 0, 0).map_err(io_error)?;
        self.open_ino(attr.ino)
    }

    fn open(&self, path: &str) -> io::Result<Box<dyn OpenFile>> {
        let ino = self.resolve(path)?;
        self.open_ino(ino)
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        let (parent, name) = self.parent_of(path)?;
        self.fs.unlink(parent, name).map_err(io_error)
    }

    fn stat(&self, path: &str) -> io::Result<u64> {
        let ino = self.resolve(path)?;
        Ok(self.fs.getattr(ino).map_err(io_error)?.size)
    }

    fn sync(&self) -> io::Result<()> {
        self.fs.sync().map_err(io_error)
    }
}

struct LibFile {
    fs: Arc<Filesystem>,
    ino: u32,
    /// Keeps the inode open (an unlinked file lives until the last close).
    slot: Arc<InodeSlot>,
}

impl OpenFile for LibFile {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut done = 0;
        while done < data.len() {
            let n =
                self.fs.write(self.ino, offset + done as u64, &data[done..]).map_err(io_error)?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "write made no progress"));
            }
            done += n;
        }
        Ok(())
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.fs.read(self.ino, offset, buf).map_err(io_error)
    }

    fn size(&mut self) -> io::Result<u64> {
        Ok(self.fs.getattr(self.ino).map_err(io_error)?.size)
    }

    fn fsync(&mut self) -> io::Result<()> {
        self.fs.fsync(self.ino, false).map_err(io_error)
    }

    fn fdatasync(&mut self) -> io::Result<()> {
        self.fs.fsync(self.ino, true).map_err(io_error)
    }
}

impl Drop for LibFile {
    fn drop(&mut self) {
        // close(2) of a file whose inode cannot be freed: the error surfaces at unmount and in
        // the e2fsck check after the run, and a drop cannot return it.
        let _ = self.fs.close_inode(&self.slot);
    }
}

// ---------------------------------------------------------------------------------------------
// any mounted directory

/// System calls on files under `root` (a mount point or a directory inside one).
pub struct PosixApi {
    root: PathBuf,
}

impl PosixApi {
    pub fn new(root: impl Into<PathBuf>) -> PosixApi {
        PosixApi { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }
}

impl FsApi for PosixApi {
    fn mkdir(&self, path: &str) -> io::Result<()> {
        std::fs::create_dir(self.path(path))
    }

    fn create(&self, path: &str) -> io::Result<Box<dyn OpenFile>> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(self.path(path))?;
        Ok(Box::new(PosixFile(file)))
    }

    fn open(&self, path: &str) -> io::Result<Box<dyn OpenFile>> {
        let file = std::fs::OpenOptions::new().read(true).write(true).open(self.path(path))?;
        Ok(Box::new(PosixFile(file)))
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        std::fs::remove_file(self.path(path))
    }

    fn stat(&self, path: &str) -> io::Result<u64> {
        Ok(std::fs::metadata(self.path(path))?.len())
    }

    fn sync(&self) -> io::Result<()> {
        let dir = std::fs::File::open(&self.root)?;
        // SAFETY: syncfs on a descriptor we own.
        if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

struct PosixFile(std::fs::File);

impl OpenFile for PosixFile {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_all_at(data, offset)
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        FileExt::read_at(&self.0, buf, offset)
    }

    fn size(&mut self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn fsync(&mut self) -> io::Result<()> {
        self.0.sync_all()
    }

    fn fdatasync(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockdev::memory::MemDevice;
    use blockdev::BlockDevice;

    fn exercise(api: &dyn FsApi) {
        api.mkdir("d").unwrap();
        let mut f = api.create("d/f").unwrap();
        f.write_at(0, b"hello").unwrap();
        f.write_at(5, b" world").unwrap();
        f.fsync().unwrap();
        assert_eq!(f.size().unwrap(), 11);
        drop(f);
        assert!(api.create("d/f").is_err(), "create is exclusive");
        let mut f = api.open("d/f").unwrap();
        let mut chunk = [0u8; 4];
        assert_eq!(read_whole(&mut *f, &mut chunk).unwrap(), 11);
        f.fdatasync().unwrap();
        drop(f);
        assert_eq!(api.stat("d/f").unwrap(), 11);
        api.unlink("d/f").unwrap();
        assert_eq!(api.stat("d/f").err().unwrap().kind(), io::ErrorKind::NotFound);
        assert_eq!(api.open("d/f").err().unwrap().kind(), io::ErrorKind::NotFound);
        api.sync().unwrap();
    }

    #[test]
    fn lib_and_posix_behave_alike() {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(32 << 20));
        let options = fs::mkfs::MkfsOptions { device_zeroed: true, ..Default::default() };
        fs::mkfs::mkfs(dev.as_ref(), &options).unwrap();
        let filesystem = Arc::new(Filesystem::open(dev, Default::default()).unwrap());
        exercise(&LibApi::new(filesystem.clone()));
        Arc::try_unwrap(filesystem).unwrap().unmount().unwrap();

        let dir = std::env::temp_dir().join(format!("quill-fsapi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        exercise(&PosixApi::new(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
