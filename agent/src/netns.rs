//! Running work inside another network namespace.
