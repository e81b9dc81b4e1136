"""oomdoctor: diagnose GPU out-of-memory incidents of LLM inference engines and prove each fix."""

__version__ = "0.1.0"
