//! Transaction ids. JBD2 tids are 32-bit counters that wrap around, so they are only ever
//! compared by signed distance (`tid_gt(x, y) = (int)(x - y) > 0` in the kernel), never with `<`.

use std::fmt;

/// A JBD2 transaction id. Ordering is by wrap-around distance, hence no `Ord` impl.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Tid(pub u32);

impl Tid {
    /// `self` was issued strictly after `other` (kernel `tid_gt`).
    pub fn is_after(self, other: Tid) -> bool {
        (self.0.wrapping_sub(other.0) as i32) > 0
    }
    /// `self` is `other` or was issued after it (kernel `tid_geq`).
    pub fn is_at_or_after(self, other: Tid) -> bool {
        (self.0.wrapping_sub(other.0) as i32) >= 0
    }
    pub fn next(self) -> Tid {
        Tid(self.0.wrapping_add(1))
    }
    pub fn prev(self) -> Tid {
        Tid(self.0.wrapping_sub(1))
    }
    /// Number of tids from `other` up to `self` (`self` must be at or after `other`).
    pub fn distance_from(self, other: Tid) -> u32 {
        debug_assert!(self.is_at_or_after(other));
        self.0.wrapping_sub(other.0)
    }
}

impl fmt::Debug for Tid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tid {}", self.0)
    }
}

impl fmt::Display for Tid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tid_comparison_survives_wrap_around() {
        let before_wrap = Tid(u32::MAX - 2);
        let after_wrap = Tid(3);
        assert!(after_wrap.is_after(before_wrap));
        assert!(!before_wrap.is_after(after_wrap));
        assert_eq!(after_wrap.distance_from(before_wrap), 6);
        assert_eq!(Tid(u32::MAX).next(), Tid(0));
        assert_eq!(Tid(0).prev(), Tid(u32::MAX));
        assert!(Tid(5).is_at_or_after(Tid(5)));
        assert!(!Tid(5).is_after(Tid(5)));
    }
}
