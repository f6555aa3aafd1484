//! The crash explorer's own parts: the model, the workload text form, the generators and the
//! crash-state lines (the checks themselves are exercised end to end by the CLI's tests,
//! including a negative control that must fail them).

use crashtest::explore::{
    default_configs, parse_state_line, rotation, state_line, workload, Options, WorkloadKind,
};
use crashtest::model::{Kind, Model};
use crashtest::run::{model_states, record};
use crashtest::workload::{ace, mailbox, threaded, Config, Op, Workload};
use ondisk::testing::seed;

fn op(s: &str) -> Op {
    s.parse().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_model_follows_posix() {
    let mut m = Model::new();
    for (k, line) in
        ["mkdir A", "mkdir A/C", "creat A/C/foo", "write A/C/foo 10 5", "link A/C/foo bar"]
            .iter()
            .enumerate()
    {
        m.apply(&op(line), k, k as u64 + 1).unwrap();
    }
    let foo = &m.get("A/C/foo").unwrap().data;
    assert_eq!(foo.len(), 15);
    assert!(foo[..10].iter().all(|&b| b == 0) && foo[10..].iter().all(|&b| b != 0));
    assert_eq!(m.links(m.names["bar"]), 2);
    // A directory rename moves what is under it; the hard link keeps its group.
    m.apply(&op("rename A B"), 5, 6).unwrap();
    assert!(m.is_file("B/C/foo") && !m.names.contains_key("A/C/foo"));
    let ns = m.namespace();
    assert_eq!(ns["B/C/foo"].1, ns["bar"].1, "one link group");
    assert_eq!(m.get("B").unwrap().changed, 6);
    // What POSIX refuses, the model refuses, unchanged.
    let before = m.clone();
    for bad in [
        "rmdir B",
        "creat nowhere/x",
        "rename B B/C/D",
        "unlink B",
        "link B x",
        "removexattr bar user.q0",
    ] {
        assert!(m.apply(&op(bad), 6, 7).is_err(), "{bad} must be refused");
    }
    assert_eq!(m, before);
    m.apply(&op("truncate bar 3"), 6, 7).unwrap();
    assert_eq!(m.get("B/C/foo").unwrap().data.len(), 3, "a link shares the inode");
    m.apply(&op("symlink sym 70"), 7, 8).unwrap();
    assert_eq!(m.kind("sym"), Some(Kind::Symlink));
    assert_eq!(m.get("sym").unwrap().data.len(), 70);
    // RENAME_WHITEOUT moves the file and leaves a whiteout, which unlink does not take.
    m.apply(&op("rename sym B/moved whiteout"), 8, 9).unwrap();
    assert_eq!(m.kind("B/moved"), Some(Kind::Symlink));
    assert_eq!(m.kind("sym"), Some(Kind::Whiteout));
    assert_eq!(m.namespace()["sym"].0, 'c', "a character device in the tree");
    assert!(m.apply(&op("unlink sym"), 9, 10).is_err());
}

#[test]
fn workloads_survive_their_text_form_and_are_valid() {
    let base = seed("workloads_text");
    for k in 0..300u64 {
        let config = Config { dirty_kib: 16, ..Config::default() };
        let w = match k % 5 {
            4 => threaded(base ^ k, 3, 8, config),
            3 => mailbox(base ^ k, config),
            _ => ace(base ^ k, config),
        };
        let back = Workload::parse(&w.to_text()).unwrap_or_else(|e| panic!("{e}\n{}", w.to_text()));
        assert_eq!(back, w, "seed {}", base ^ k);
        model_states(&w).unwrap_or_else(|e| panic!("seed {}: {e}", base ^ k));
        let core = w.threads[0].iter().filter(|o| !o.is_persistence()).count();
        if w.name.starts_with("ace-") {
            assert!((1..=3).contains(&core), "ACE runs 1 to 3 core ops: {}", w.to_text());
        }
    }
}

#[test]
fn every_op_kind_and_persistence_point_is_generated() {
    let opts = Options::standard(seed("op_kinds"));
    let mut seen = std::collections::BTreeSet::new();
    for k in 0..400 {
        for ops in workload(&opts, k).threads {
            for o in ops {
                seen.insert(o.to_string().split(' ').next().unwrap().to_string());
            }
        }
    }
    for kind in [
        "creat",
        "mkdir",
        "rmdir",
        "unlink",
        "link",
        "rename",
        "write",
        "falloc",
        "truncate",
        "symlink",
        "setxattr",
        "removexattr",
        "fsync",
        "fdatasync",
        "sync",
    ] {
        assert!(seen.contains(kind), "{kind} never generated: {seen:?}");
    }
    let whiteouts = (0..400).flat_map(|k| workload(&opts, k).threads).flatten();
    assert!(
        whiteouts.into_iter().any(|o| matches!(o, Op::Rename { whiteout: true, .. })),
        "no rename with RENAME_WHITEOUT generated"
    );
}

#[test]
fn bad_workload_text_is_refused() {
    for bad in [
        "t0 write foo 0 0",
        "t0 write /abs 0 10",
        "t0 rename a ../b",
        "t0 setxattr foo trusted.x 3",
        "t0 frobnicate foo",
        "config preset=nope",
        "config data=writeback",
        "t99 sync",
    ] {
        assert!(Workload::parse(bad).is_err(), "{bad:?} must be refused");
    }
}

#[test]
fn crash_lines_round_trip_and_stale_ones_are_refused() {
    let text = "setup creat foo\nt0 write foo 0 9000\nt0 fsync foo\nt0 write foo 100 100\n";
    let w = Workload::parse(text).unwrap();
    let rec = record(&w).unwrap();
    let states = rec.device.crash_states(&Options::standard(1).crash);
    assert!(states.len() > 3);
    for s in &states {
        let back = parse_state_line(&state_line(s), &rec).unwrap();
        assert_eq!(
            (back.crash_at, back.kind, &back.applied, &back.torn),
            (s.crash_at, s.kind, &s.applied, &s.torn)
        );
        assert_eq!(back.marks, s.marks);
    }
    let ops = rec.device.ops_len();
    for bad in [
        format!("crash at={} kind=Subset applied=", ops + 1),
        "crash at=0 kind=Subset applied=0".to_string(),
        "crash at=0 kind=Torn applied= torn=0:0".to_string(),
        "crash at=2 kind=Sideways applied=".to_string(),
    ] {
        assert!(parse_state_line(&bad, &rec).is_err(), "{bad} must be refused");
    }
}

#[test]
fn each_kind_of_workload_rotates_through_every_preset_and_configuration() {
    let mut opts = Options::standard(1);
    let configs = default_configs();
    for preset in journal::config::PRESETS {
        for data in ["ordered", "journal"] {
            let n = configs.iter().filter(|c| c.preset == *preset && c.data == data).count();
            assert_eq!(n, 2, "{preset}, data={data}: one config per page-cache size");
        }
    }
    let barrier = configs.iter().filter(|c| c.preset == "cjfs,commit_record=barrier").count();
    assert_eq!(barrier, 4, "CJFS with barrier commit blocks, in both data modes and cache sizes");
    // Today's list, and lists whose length is a multiple of threaded_every (as 6 presets
    // make 24 configurations with threaded_every 8), where a single rotation over k would
    // split the configurations between the kinds of workload.
    for len in [configs.len(), 16, 24, 7] {
        opts.configs = (0..len).map(|i| configs[i % configs.len()].clone()).collect();
        let mut seen = [vec![0usize; len], vec![0usize; len], vec![0usize; len]];
        let rounds = len * opts.threaded_every * opts.mailbox_every;
        for k in 0..2 * rounds {
            let (kind, config) = rotation(&opts, k);
            let w = workload(&opts, k);
            let expected = match kind {
                WorkloadKind::Ace => "ace-",
                WorkloadKind::Threaded => "threads-",
                WorkloadKind::Mailbox => "mailbox-",
            };
            assert!(w.name.starts_with(expected), "k {k}: {kind:?} but {}", w.name);
            assert_eq!(w.config, opts.configs[config], "k {k}");
            seen[kind as usize][config] += 1;
        }
        for (kind, counts) in ["ace", "threaded", "mailbox"].iter().zip(&seen) {
            let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(*min > 0 && max - min <= 1, "{len} configs, {kind}: {counts:?}");
        }
    }
}
