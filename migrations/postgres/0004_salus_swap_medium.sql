-- Where a swapped-out trial's state went: 'memory' (host memory of a live
-- process: the built-in trials, and workers whose client tracks their
-- state) or 'checkpoint' (a file; the worker process exited).
ALTER TABLE salus_swaps ADD COLUMN medium VARCHAR(16) NOT NULL DEFAULT 'memory';
