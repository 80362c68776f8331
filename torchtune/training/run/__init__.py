"""The loop's shared pieces: step accounting, forward/backward, metrics and the run summary, validation,
output folder and resume, step checkpoints, stop signals and the NaN guard, eval after training."""
