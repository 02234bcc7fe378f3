//! The flags of [`Capabilities`]: what each asks of the host, and the set operations.

use super::Capabilities;

impl Capabilities {
    /// Nothing asked.
    pub const NONE: Self = Self { bits: 0 };
    /// Fill [`ReplicaView::matched_tokens`] for every replica on every request.
    pub const NEEDS_EXACT_MATCH: Self = Self { bits: 1 };
    /// Call `on_evict` for every cache eviction.
    pub const WANTS_EVICTIONS: Self = Self { bits: 1 << 1 };
    /// Keep [`ReplicaView::outstanding_work`] exact on every request.
    pub const NEEDS_OUTSTANDING_WORK: Self = Self { bits: 1 << 2 };
    /// A disaggregation router: it answers [`crate::Router::route_pair`] and runs only on a
    /// prefill/decode-disaggregated cluster (a host refuses it elsewhere, and refuses routers
    /// without it there).
    pub const DISAGGREGATED: Self = Self { bits: 1 << 3 };
    // since 0.5.13 {
    /// Added in 0.5.13. A disaggregation router that hears a mixed instance join or leave both
    /// pools at once ([`crate::Router::on_mixed_change`]): a host refuses crashes on mixed
    /// instances with a router without it. The plain-Rust wrapper ([`crate::PdRouterPolicy`])
    /// sets it for every P/D router built against 0.5.13 or later.
    pub const HEARS_MIXED_CHANGES: Self = Self { bits: 1 << 4 };
    // } since 0.5.13
    /// Every flag this version of the crate defines.
    pub const KNOWN: Self = {
        let bits = 0b1111;
        // since 0.5.13 {
        let bits = bits | Self::HEARS_MIXED_CHANGES.bits;
        // } since 0.5.13
        Self { bits }
    };

    /// The raw bits, unknown ones included.
    pub const fn bits(self) -> u64 {
        self.bits
    }
    /// Flags from raw bits, keeping bits this version does not know (a newer plugin's).
    pub const fn from_bits_retain(bits: u64) -> Self {
        Self { bits }
    }
    /// Only the flags this version of the crate knows.
    pub const fn known(self) -> Self {
        Self { bits: self.bits & Self::KNOWN.bits }
    }
    /// True when every flag of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.bits & other.bits == other.bits
    }
    /// Both sets of flags.
    pub const fn union(self, other: Self) -> Self {
        Self { bits: self.bits | other.bits }
    }
    /// [`Self::NEEDS_EXACT_MATCH`] is set.
    pub const fn needs_exact_match(self) -> bool {
        self.contains(Self::NEEDS_EXACT_MATCH)
    }
    /// [`Self::WANTS_EVICTIONS`] is set.
    pub const fn wants_evictions(self) -> bool {
        self.contains(Self::WANTS_EVICTIONS)
    }
    /// [`Self::NEEDS_OUTSTANDING_WORK`] is set.
    pub const fn needs_outstanding_work(self) -> bool {
        self.contains(Self::NEEDS_OUTSTANDING_WORK)
    }
    /// [`Self::DISAGGREGATED`] is set.
    pub const fn disaggregated(self) -> bool {
        self.contains(Self::DISAGGREGATED)
    }
}

impl std::ops::BitOr for Capabilities {
    type Output = Self;
    fn bitor(self, other: Self) -> Self {
        self.union(other)
    }
}

impl std::ops::BitOrAssign for Capabilities {
    fn bitor_assign(&mut self, other: Self) {
        *self = self.union(other);
    }
}
