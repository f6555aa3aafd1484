//! Behaviour of the memory device under concurrent use.

use blockdev::memory::{MemDevice, CHUNK_BYTES};
use blockdev::BlockDevice;

#[test]
fn concurrent_writers_to_different_places_all_land() {
    let threads = 8usize;
    let per_thread = 2 * CHUNK_BYTES;
    let dev = MemDevice::new((threads * per_thread) as u64);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let dev = &dev;
            scope.spawn(move || {
                // Writes straddle chunk boundaries: 3 KiB pieces over two chunks.
                for (i, at) in (0..per_thread).step_by(3072).enumerate() {
                    let len = 3072.min(per_thread - at);
                    let data = vec![(t * 16 + i % 16) as u8; len];
                    let offset = (t * per_thread + at) as u64;
                    dev.write_at(offset, &data).unwrap();
                    let mut back = vec![0; len];
                    dev.read_at(offset, &mut back).unwrap();
                    assert_eq!(back, data);
                }
            });
        }
    });
    let image = dev.snapshot();
    for t in 0..threads {
        for (i, at) in (0..per_thread).step_by(3072).enumerate() {
            let start = t * per_thread + at;
            let len = 3072.min(per_thread - at);
            assert!(image[start..start + len].iter().all(|&b| b == (t * 16 + i % 16) as u8));
        }
    }
}

#[test]
fn from_bytes_and_snapshot_round_trip() {
    let bytes: Vec<u8> = (0..(CHUNK_BYTES * 3 + 512)).map(|i| (i % 253) as u8).collect();
    let dev = MemDevice::from_bytes(bytes.clone());
    assert_eq!(dev.size_bytes(), bytes.len() as u64);
    assert_eq!(dev.snapshot(), bytes);
    dev.flush().unwrap();
}
