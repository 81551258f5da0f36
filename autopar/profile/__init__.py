"""autopar.profile: measure this machine and write a hardware profile (costmodels format).

The driver is ``autopar.profile.run`` (spawn the ranks, merge what they measured, where the
file goes); ``measure`` is what each spawned rank times and the timing helpers, ``kernels`` the
kernel-level rates (it builds on ``measure``), ``fit`` the α-β fits, and ``build`` which
measurement becomes which profile field (the TOML itself is ``costmodels.profiles.profile_format``'s).
"""
from autopar.profile.build import build_profile, fits, in_step_fits
from autopar.profile.run import default_name, output_path, profile_machine, write_profile

__all__ = ["profile_machine", "build_profile", "write_profile", "default_name", "output_path", "fits",
           "in_step_fits"]
