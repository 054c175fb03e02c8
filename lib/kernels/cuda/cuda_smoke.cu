// Placeholder replaced by the GPU backend.
