//! Reading a file the user named as input (a cluster profile, a hostfile, a PBS node
//! file, a calibration, the site configuration, an env file, a DeepSpeed config, the job
//! secret): it must be a regular file of at most [`MAX_BYTES`]. `/dev/zero` given as a
//! cluster file was read until memory ran out; a FIFO would block forever.
//!
//! A leaf: it imports no stage, so every stage that reads an input file uses it.

use std::io::{self, Read};
use std::path::Path;

/// The most bytes an input file may hold: 1 GiB. A profile of the 1,000,000 nodes the node
/// list allows, with its measured pairs, is about 100 MB; larger is a wrong file.
pub const MAX_BYTES: u64 = 1 << 30;

/// The file's bytes, or an error saying it is not a regular file or is too large.
pub fn read(path: impl AsRef<Path>) -> io::Result<Vec<u8>> {
    let path = path.as_ref();
    // Checked before opening: opening a FIFO waits for a writer.
    check(&std::fs::metadata(path)?)?;
    let file = std::fs::File::open(path)?;
    check(&file.metadata()?)?;
    let mut bytes = Vec::new();
    // A file that grows while read (or reports no size, as /proc's do) stops at the cap.
    file.take(MAX_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}

/// The file's text (UTF-8), as [`read`].
pub fn read_to_string(path: impl AsRef<Path>) -> io::Result<String> {
    String::from_utf8(read(path)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "is not UTF-8 text (give a text file)",
        )
    })
}

fn check(meta: &std::fs::Metadata) -> io::Result<()> {
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "is not a regular file (give a file, not a device, pipe or directory)",
        ));
    }
    if meta.len() > MAX_BYTES {
        return Err(too_large());
    }
    Ok(())
}

fn too_large() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "is larger than 1 GiB, the most an input file may hold (check the path)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// N10: `/dev/zero` as an input file was read until memory ran out.
    #[test]
    fn n10_only_a_regular_file_of_bounded_size_is_read() {
        for not_a_file in ["/dev/zero", "/dev/null", "/tmp"] {
            let e = read(Path::new(not_a_file)).unwrap_err();
            assert!(
                e.to_string().contains("not a regular file"),
                "{not_a_file}: {e}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "text").unwrap();
        assert_eq!(read_to_string(&file).unwrap(), "text");
        std::fs::write(&file, [0xff, 0xfe]).unwrap();
        assert!(read_to_string(&file)
            .unwrap_err()
            .to_string()
            .contains("UTF-8"));
        // A sparse file over the cap is refused by its size, without reading it.
        let big = std::fs::File::create(&file).unwrap();
        big.set_len(MAX_BYTES + 1).unwrap();
        assert!(read(&file).unwrap_err().to_string().contains("1 GiB"));
    }
}
