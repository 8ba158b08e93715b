//! Device tests that did not run must not look like passes.
//!
//! `cargo test` has no "skipped" outcome: a CUDA test body on a machine
//! without a GPU returns early and counts as `ok`. So every device test
//! records what happened, one line per test, in the file named by
//! `SALUS_TUNE_DEVICE_TEST_LOG`, and `scripts/test.sh` counts the lines in
//! its last line: `device tests: R run, S skipped (...)`. With
//! `SALUS_TUNE_REQUIRE_CUDA` set (the GPU check sets it), a skip is a failure.

use std::io::Write;

/// Records that `test`, which needs the *absence* of `device`, was skipped
/// because the device is here. Counted like any skip; never a failure.
pub fn skipped_because_present(test: &str, device: &str, why: &str) {
    append(&format!("skip {device} {test}: {}", why.replace('\n', " ")));
    eprintln!("{test}: SKIPPED (not run): {why}");
}

fn append(line: &str) {
    if let Some(path) = std::env::var_os("SALUS_TUNE_DEVICE_TEST_LOG") {
        // One short append per line: whole lines even from parallel tests.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(format!("{line}\n").as_bytes());
        }
    }
}

/// Records the outcome of device test `test`: run, or skipped for `why`.
/// Returns whether the test may go on; panics instead of skipping when a
/// device is required.
pub fn record(test: &str, device: &str, why_not: Option<&str>) -> bool {
    let line = match why_not {
        None => format!("run {device} {test}"),
        Some(why) => format!("skip {device} {test}: {}", why.replace('\n', " ")),
    };
    append(&line);
    match why_not {
        None => true,
        Some(why) if std::env::var_os("SALUS_TUNE_REQUIRE_CUDA").is_some() => {
            panic!("{test}: {device} is required (SALUS_TUNE_REQUIRE_CUDA) but unavailable: {why}")
        }
        Some(why) => {
            eprintln!("{test}: SKIPPED on {device} (not run): {why}");
            false
        }
    }
}

/// The one device matrix of the tests (candle's one body, every device):
/// for each listed generic test body `fn name<B: Backend>(fixture: &mut F<B>)`,
/// a test `cpu::name` that runs it on the CPU fixture `cpu`, and a test
/// `cuda::name` that runs it on `cuda(backend)` when a CUDA device is
/// present, else records itself as skipped (counted by `scripts/test.sh`;
/// cargo still shows `ok`). Paths in the fixtures resolve inside the
/// generated modules: write them from the crate root.
#[macro_export]
macro_rules! device_tests {
    (cpu: $cpu:expr, cuda: $cuda:expr; $($name:ident),* $(,)?) => {
        mod cpu {
            $(
                #[test]
                fn $name() {
                    super::$name(&mut $cpu);
                }
            )*
        }
        mod cuda {
            $(
                #[test]
                // Without the `cuda` feature the stub's backend type has no
                // values, so the body is unreachable there.
                #[allow(unreachable_code)]
                fn $name() {
                    if let Some(b) = $crate::cuda::device_for_test(stringify!($name)) {
                        let fixture = $cuda;
                        super::$name(&mut fixture(b));
                    }
                }
            )*
        }
    };
}
