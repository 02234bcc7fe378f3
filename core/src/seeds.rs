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

/// A hasher for the simulators' integer-keyed maps: each written word is folded in with [`mix`].
/// Deterministic (the same map iterates the same way on every run and build) and a few times
/// cheaper than the standard library's SipHash, whose flooding resistance a simulation does not
/// need.
#[derive(Clone, Copy, Default)]
pub struct MixHasher(u64);

impl std::hash::Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = mix(self.0 ^ n);
    }
}

/// A `HashMap` hashed with [`MixHasher`].
pub type MixMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<MixHasher>>;

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
