"""dmt's Hydra config groups (``<group>/<option>.yaml``), shipped in the package as ``pkg://dmt.conf``
so that an installed dmt finds them from any working directory."""
