//! Proptest configuration shared by the property tests: a fixed RNG seed so `cargo test` runs
//! the same cases on every machine (CI never flakes), unless `PROPTEST_RNG_SEED` /
//! `PROPTEST_CASES` ask for other (or more) cases, e.g. a long randomised run on demand.

use proptest::test_runner::{Config, RngAlgorithm, RngSeed};

const SEED: u64 = 0x7012_9ac5;

pub fn deterministic(cases: u32) -> Config {
    // `default()` reads PROPTEST_CASES and PROPTEST_RNG_SEED.
    let mut config = Config {
        rng_algorithm: RngAlgorithm::ChaCha,
        ..Config::default()
    };
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = RngSeed::Fixed(SEED);
    }
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    config
}
