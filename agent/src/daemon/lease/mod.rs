//! One lease: its live view ([`live`]), the task that runs it ([`task`]),
//! its record on disk ([`persist`]) and, when asked, its address on the pod
//! interface ([`apply`]).

pub(crate) mod apply;
pub(crate) mod live;
pub(crate) mod persist;
pub(crate) mod task;
