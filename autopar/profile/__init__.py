"""autopar.profile: measure this machine and write a hardware profile (costmodels format).

The driver is ``autopar.profile.run`` (which profile field comes from which measurement);
``measure`` is what each spawned rank times, ``kernels`` the kernel-level rates, ``fit`` the
α-β fits.
"""
from autopar.profile.run import build_profile, default_name, fits, in_step_fits, profile_machine, write_profile

__all__ = ["profile_machine", "build_profile", "write_profile", "default_name", "fits", "in_step_fits"]
