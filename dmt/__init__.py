"""dmt: Disaggregated Multi-Tower recommendation models on TorchRec."""

__version__ = "0.1.0"
