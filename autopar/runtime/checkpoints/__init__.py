"""Checkpoints: save and resume under any plan with torch.distributed.checkpoint (`dcp`, its files
`dcp_files`), the serial state dict gathered from a running plan (`gather`) and written out of a
checkpoint one tensor at a time (`export`)."""
