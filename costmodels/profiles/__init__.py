"""The profiles: what the hardware and the software are, as files a user can open and edit.

Owns the hardware profiles (``hardware-profiles/*.toml`` at the repository root, installed as
package data), the runtime profiles (``runtime-profiles/*.toml``: what each training stack
overlaps, exposes and can run), the heterogeneous cluster description, the error bands the
calibration wrote, the link topology (which tier a group crosses), and the loaders and format
checks of all of them. May import ``costmodels.contracts`` only.
"""
