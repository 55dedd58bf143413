//! Pod vs. VM detection and the VM MAC resolution chain.
