//! Seed derivation: every random stream of a run comes from the workload's seed, a seed index and
//! a stream name, so streams are independent of each other and of the policy under test (common
//! random numbers: every policy sees the same arrivals and sizes).

use rand::SeedableRng;

/// The host's generator: a named algorithm, so a seed replays exactly on any build.
pub type SimRng = rand::rngs::Xoshiro256PlusPlus;

/// SplitMix64 finaliser: a bijective mix of 64 bits.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Seed of run `index` (0-based) of a workload whose first seed is `base`: `base + index`, so
/// `--seed` names runs the way users count them.
pub fn seed_for(base: u64, index: u32) -> u64 {
    base.wrapping_add(index as u64)
}

/// Seed of the named stream of a run.
pub fn stream_seed(run_seed: u64, stream: &str) -> u64 {
    let mut h = mix(run_seed);
    for b in stream.bytes() {
        h = mix(h ^ b as u64);
    }
    h
}

/// The named stream's generator.
pub fn stream(run_seed: u64, name: &str) -> SimRng {
    SimRng::seed_from_u64(stream_seed(run_seed, name))
}
