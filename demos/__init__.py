"""Gradio demos (`pip install -e ".[demo]"`): `python demos/<name>.py --port 7860`."""
