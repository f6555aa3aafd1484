//! Behaviour of the simulated SSD. Wall time is never asserted; the modelled counters are.

use std::time::Duration;

use blockdev::simssd::{SimSsd, SimSsdConfig, SimSsdStats};
use blockdev::{BlockDevice, Write};

/// The stats with the observed (timing-dependent) fields cleared.
fn modelled(mut s: SimSsdStats) -> SimSsdStats {
    s.queue_depth_max = 0;
    s.channels_busy_max = 0;
    s
}

#[test]
fn sim_ssd_counts_modelled_busy_time_per_op_kind() {
    let ssd = SimSsd::new(1 << 20, SimSsdConfig::default());
    let mut buf = vec![0; 4096];
    ssd.read_at(0, &mut buf).unwrap();
    ssd.read_at(4096, &mut buf[..512]).unwrap(); // a partial page costs a whole page
    ssd.write_at(0, &[1; 8192]).unwrap();
    ssd.write_fua_at(8192, &[2; 4096]).unwrap();
    ssd.flush().unwrap();
    let s = ssd.stats();
    assert_eq!((s.reads, s.bytes_read, s.read_busy_us), (2, 4608, 40));
    assert_eq!((s.writes, s.fua_writes, s.bytes_written), (2, 1, 12288));
    assert_eq!((s.write_busy_us, s.fua_busy_us), (45, 30));
    assert_eq!((s.flushes, s.flush_busy_us), (1, 200));
    assert_eq!(s.batches, 0);
    assert!(s.queue_depth_max >= 1);
}

#[test]
fn sim_ssd_batch_counts_each_member_and_stores_its_data() {
    let ssd = SimSsd::new(1 << 20, SimSsdConfig::default());
    let blocks: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 4096]).collect();
    let batch: Vec<Write<'_>> = blocks
        .iter()
        .enumerate()
        .map(|(i, data)| Write { offset: (i * 4096) as u64, data, fua: i == 19 })
        .collect();
    ssd.write_batch(&batch).unwrap();
    let s = ssd.stats();
    assert_eq!((s.batches, s.writes, s.fua_writes), (1, 20, 1));
    assert_eq!((s.write_busy_us, s.fua_busy_us), (20 * 15, 30));
    assert!(s.channels_busy_max >= 1 && s.channels_busy_max <= 8);
    let image = ssd.snapshot();
    for (i, data) in blocks.iter().enumerate() {
        assert_eq!(&image[i * 4096..(i + 1) * 4096], &data[..], "batch member {i}");
    }
}

/// The same ops, issued from `threads` threads.
fn run_workload(threads: usize) -> (SimSsdStats, Vec<u8>) {
    let config = SimSsdConfig { channels: 2, ..SimSsdConfig::default() };
    let ssd = SimSsd::new(256 * 4096, config);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let ssd = &ssd;
            scope.spawn(move || {
                for i in (t..64).step_by(threads) {
                    ssd.write_at((i * 4096) as u64, &[i as u8; 4096]).unwrap();
                    if i % 4 == 0 {
                        ssd.write_fua_at(((64 + i) * 4096) as u64, &[1; 1024]).unwrap();
                    }
                    if i % 8 == 7 {
                        ssd.flush().unwrap();
                    }
                    let mut back = vec![0; 4096];
                    ssd.read_at((i * 4096) as u64, &mut back).unwrap();
                    assert_eq!(back, vec![i as u8; 4096]);
                }
            });
        }
    });
    let stats = ssd.stats();
    assert!(stats.channels_busy_max <= 2, "more transfers in service than channels");
    assert!(stats.queue_depth_max <= threads as u64);
    (modelled(stats), ssd.snapshot())
}

#[test]
fn sim_ssd_modelled_counters_do_not_depend_on_thread_interleaving() {
    let (one, image_one) = run_workload(1);
    let (four, image_four) = run_workload(4);
    assert_eq!(one, four);
    assert_eq!(image_one, image_four);
    assert_eq!((one.writes, one.flushes, one.reads), (64 + 16, 8, 64));
}

#[test]
fn sim_ssd_flush_waits_for_writes_submitted_before_it() {
    // A slow write; the flush is issued once the write holds a channel, and must not return
    // before the write's data is on the media.
    let config = SimSsdConfig { write_us: 20_000, flush_us: 0, ..SimSsdConfig::default() };
    let ssd = SimSsd::new(8192, config);
    std::thread::scope(|scope| {
        scope.spawn(|| ssd.write_at(0, &[9; 4096]).unwrap());
        // Bounded wait for the writer thread to start its transfer.
        let mut waited = 0;
        while ssd.stats().writes == 0 {
            assert!(waited < 10_000, "the writer never started");
            std::thread::sleep(Duration::from_millis(1));
            waited += 1;
        }
        ssd.flush().unwrap();
        assert_eq!(&ssd.snapshot()[..4096], &[9; 4096][..]);
    });
}

#[test]
fn sim_ssd_rejects_misaligned_io_without_counting_it() {
    let ssd = SimSsd::new(8192, SimSsdConfig::default());
    assert!(ssd.write_at(100, &[0; 512]).is_err());
    assert!(ssd.write_batch(&[Write { offset: 8192, data: &[0; 512], fua: false }]).is_err());
    assert_eq!(modelled(ssd.stats()), SimSsdStats::default());
    ssd.reset_stats();
}
