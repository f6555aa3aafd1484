//! `mount.quill`: the helper mount(8) runs for `mount -t quill IMAGE DIR` and for /etc/fstab
//! lines of type `quill`; it is the `quill` binary called by that name (install it as
//! `ln -s "$(command -v quill)" /sbin/mount.quill`, mount(8) looks in /sbin only). It takes
//! mount(8)'s helper arguments, `mount.quill IMAGE DIR [-sfnv] [-o OPTIONS] [-t TYPE]`, and
//! mounts as `quill mount -o OPTIONS IMAGE DIR` does (in the background).
//!
//! -s: ignore unknown options (sloppy); -f: check everything but do not mount (fake);
//! -n: accepted (there is no mtab to update); -v: say what is done on stderr.
//! Exit codes: 0 mounted, 1 the mount failed, 2 bad usage.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::mount_cmd;

const USAGE: &str = "usage: mount.quill IMAGE DIR [-sfnv] [-o OPTIONS] [-t quill]";

fn parse(args: Vec<String>) -> Result<mount_cmd::MountRequest, String> {
    let mut positional = Vec::new();
    let mut request = mount_cmd::MountRequest {
        image: PathBuf::new(),
        mountpoint: PathBuf::new(),
        options: Vec::new(),
        foreground: false,
        sloppy: false,
        verbose: false,
        fake: false,
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "-h" || arg == "--help" {
            return Err(USAGE.into());
        }
        let Some(flags) = arg.strip_prefix('-').filter(|f| !f.is_empty()) else {
            positional.push(arg);
            continue;
        };
        // Flags may be grouped (-sv); -o and -t take the rest of the word or the next one.
        for (i, flag) in flags.char_indices() {
            match flag {
                's' => request.sloppy = true,
                'f' => request.fake = true,
                'n' => {}
                'v' => request.verbose = true,
                'o' | 't' => {
                    let rest = &flags[i + 1..];
                    let value = if rest.is_empty() {
                        args.next().ok_or_else(|| format!("-{flag} needs a value; {USAGE}"))?
                    } else {
                        rest.to_string()
                    };
                    if flag == 'o' {
                        request.options.push(value);
                    } else if value != "quill" {
                        return Err(format!("mount.quill mounts type quill, not {value:?}"));
                    }
                    break;
                }
                other => return Err(format!("unknown flag -{other}; {USAGE}")),
            }
        }
    }
    let [image, mountpoint]: [String; 2] =
        positional.try_into().map_err(|_| format!("expected an image and a directory; {USAGE}"))?;
    request.image = image.into();
    request.mountpoint = mountpoint.into();
    Ok(request)
}

/// Whether the program was called as the mount helper (by the name mount(8) uses).
pub fn called_as_helper() -> bool {
    std::env::args_os()
        .next()
        .map(|argv0| PathBuf::from(argv0).file_name() == Some("mount.quill".as_ref()))
        .unwrap_or(false)
}

pub fn main() -> ExitCode {
    let request = match parse(std::env::args().skip(1).collect()) {
        Ok(request) => request,
        Err(msg) => {
            eprintln!("mount.quill: {msg}");
            return ExitCode::from(2);
        }
    };
    match mount_cmd::run(request) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if !err.is_logged() {
                eprintln!("mount.quill: {}", err.message());
            }
            ExitCode::from(err.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn takes_mounts_calling_convention() {
        let r = parse(args(&["/img", "/mnt", "-sv", "-o", "ro,commit=3", "-n", "-t", "quill"]))
            .unwrap();
        assert_eq!(r.image, PathBuf::from("/img"));
        assert_eq!(r.mountpoint, PathBuf::from("/mnt"));
        assert_eq!(r.options, vec!["ro,commit=3".to_string()]);
        assert!(r.sloppy && r.verbose && !r.fake && !r.foreground);
        let r = parse(args(&["-f", "-orw", "/img", "/mnt"])).unwrap();
        assert!(r.fake);
        assert_eq!(r.options, vec!["rw".to_string()]);
    }

    #[test]
    fn refuses_what_it_does_not_understand() {
        assert!(parse(args(&["/img"])).unwrap_err().contains("expected an image"));
        assert!(parse(args(&["/img", "/mnt", "/x"])).is_err());
        assert!(parse(args(&["/img", "/mnt", "-x"])).unwrap_err().contains("-x"));
        assert!(parse(args(&["/img", "/mnt", "-o"])).unwrap_err().contains("needs a value"));
        assert!(parse(args(&["/img", "/mnt", "-t", "ext4"])).unwrap_err().contains("ext4"));
    }
}
