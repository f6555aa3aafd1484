#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| quill_fuzzing::quota_tree(data));
