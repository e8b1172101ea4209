"""mmspec: make multimodal and diffusion models generate faster without changing what they generate."""

__version__ = "0.1.0"
