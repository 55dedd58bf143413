//! VFIO driver handoff, journaled on disk so an interrupted handoff is healed on start.
