//! The Kubernetes API client: pods get/patch with a resourceVersion precondition, VMIs get.
