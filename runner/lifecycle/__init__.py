"""A run's life on the host: admission, the queue, the task manager, its supervision and conclusion,
recovery, metrics."""
