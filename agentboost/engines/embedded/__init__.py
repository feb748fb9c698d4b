"""The embedded engine: ``LocalEngine`` (its admission, scheduler and model step) and its kernels."""
