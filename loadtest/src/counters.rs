//! Counters shared by many tasks, declared once ([`counters!`]): a struct of atomics
//! (plus locked maps and histograms), read while the tasks run, and its plain
//! `Serialize` copy with the same fields in the same order.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::stats::{LatencyHistogram, Percentiles};

/// A field of a counters struct that is not an atomic (a locked map, a histogram), and
/// what it reads as in the copy.
pub trait Snap {
    /// The plain value.
    type Out;
    /// A copy (empty if the lock was poisoned).
    fn snap(&self) -> Self::Out;
}

impl<K: Ord + Clone> Snap for Mutex<BTreeMap<K, u64>> {
    type Out = BTreeMap<K, u64>;
    fn snap(&self) -> Self::Out {
        self.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

impl Snap for LatencyHistogram {
    type Out = Percentiles;
    fn snap(&self) -> Percentiles {
        self.percentiles()
    }
}

/// Counting on an [`AtomicU64`] (relaxed: a counter orders nothing).
pub trait Count {
    /// Adds one.
    fn inc(&self);
    /// Adds `n`.
    fn add(&self, n: u64);
}

impl Count for AtomicU64 {
    fn inc(&self) {
        self.add(1);
    }

    fn add(&self, n: u64) {
        self.fetch_add(n, Ordering::Relaxed);
    }
}

/// Counts one occurrence of `key` in a locked map.
pub fn bump<K: Ord>(map: &Mutex<BTreeMap<K, u64>>, key: K) {
    if let Ok(mut m) = map.lock() {
        *m.entry(key).or_default() += 1;
    }
}

/// Declares `$counters` (public `AtomicU64` fields; after a `;`, private [`Snap`]
/// fields; after a second `;`, fields the copy leaves out), its copy `$snapshot` (the
/// same fields, plain and public, each [`Snap`] field as its [`Snap::Out`]) and
/// `$counters::snapshot`.
macro_rules! counters {
    (
        $(#[$cdoc:meta])* $cvis:vis struct $counters:ident;
        $(#[$sdoc:meta])* $svis:vis struct $snapshot:ident {
            $( $(#[$doc:meta])* $field:ident, )*
            ;
            $( $(#[$mdoc:meta])* $mfield:ident: $mty:ty, )*
            $( ; $( $(#[$gdoc:meta])* $gvis:vis $gfield:ident: $gty:ty, )* )?
        }
    ) => {
        $(#[$cdoc])*
        #[derive(Debug, Default)]
        $cvis struct $counters {
            $( $(#[$doc])* pub $field: std::sync::atomic::AtomicU64, )*
            $( $mfield: $mty, )*
            $($( $(#[$gdoc])* $gvis $gfield: $gty, )*)?
        }

        $(#[$sdoc])*
        #[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
        $svis struct $snapshot {
            $( $(#[$doc])* pub $field: u64, )*
            $( $(#[$mdoc])* pub $mfield: <$mty as $crate::counters::Snap>::Out, )*
        }

        impl $counters {
            /// A copy of every counter.
            pub fn snapshot(&self) -> $snapshot {
                $snapshot {
                    $( $field: self.$field.load(std::sync::atomic::Ordering::Relaxed), )*
                    $( $mfield: $crate::counters::Snap::snap(&self.$mfield), )*
                }
            }
        }
    };
}
pub(crate) use counters;
