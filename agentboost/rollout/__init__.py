"""Running many rollouts: concurrency, progress, resumable results, worker processes."""
