//! Counters by reason, shared by both engines' statistics: one slot per
//! member of a closed set of reasons (drop reasons, malformed options).

use std::marker::PhantomData;

/// A closed set of reasons, each with a stable slot.
pub(crate) trait Counted: Copy + PartialEq + 'static {
    /// Every member, in slot order.
    const ALL: &'static [Self];

    /// The member's slot in [`Counted::ALL`].
    fn index(self) -> usize {
        Self::ALL
            .iter()
            .position(|r| *r == self)
            .unwrap_or_default()
    }
}

/// One monotonic counter per member of `K` (`N` is `K::ALL.len()`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tally<K, const N: usize> {
    counts: [u64; N],
    kind: PhantomData<K>,
}

impl<K, const N: usize> Default for Tally<K, N> {
    fn default() -> Self {
        Self {
            counts: [0; N],
            kind: PhantomData,
        }
    }
}

impl<K: Counted, const N: usize> Tally<K, N> {
    pub(crate) fn count(&mut self, k: K) {
        self.counts[k.index()] += 1;
    }

    pub(crate) fn get(&self, k: K) -> u64 {
        self.counts[k.index()]
    }

    pub(crate) fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The non-zero counters, in slot order.
    pub(crate) fn nonzero(&self) -> impl Iterator<Item = (K, u64)> + '_ {
        K::ALL
            .iter()
            .zip(self.counts.iter())
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| (*k, *n))
    }

    /// The non-zero counters, the tally left at zero.
    pub(crate) fn take(&mut self) -> Vec<(K, u64)> {
        let taken = self.nonzero().collect();
        *self = Self::default();
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum R {
        A,
        B,
        C,
    }

    impl Counted for R {
        const ALL: &'static [R] = &[R::A, R::B, R::C];
    }

    #[test]
    fn counts_by_slot_and_takes() {
        let mut t = Tally::<R, 3>::default();
        t.count(R::C);
        t.count(R::A);
        t.count(R::C);
        assert_eq!((t.get(R::A), t.get(R::B), t.get(R::C)), (1, 0, 2));
        assert_eq!(t.total(), 3);
        assert_eq!(t.nonzero().collect::<Vec<_>>(), [(R::A, 1), (R::C, 2)]);
        assert_eq!(t.take(), [(R::A, 1), (R::C, 2)]);
        assert_eq!(t.total(), 0);
    }
}
