//! Any text as a workload file: parsing and validation must return a workload or an error (never
//! panic, never hang), and the estimate of a valid one must be computable.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(w) = routelab_core::workload::parse(text, Path::new("fuzz.yaml")) {
        let e = routelab_core::workload::estimate::estimate(&w);
        assert!(e.bytes.is_finite() && e.seconds.is_finite(), "{e:?}");
        // A valid cluster workload's step model and prompt bound are usable.
        if let Some(c) = &w.cluster {
            let sm = c.step_model().expect("validated");
            assert!(sm.kv_capacity_tokens > 0);
            let _ = c.max_prompt_tokens();
        }
    }
});
