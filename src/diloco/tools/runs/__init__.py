"""Run folders, checkpoints and resume: atomic files, the run lock and record, the resumable driver."""
