"""The web app (`cpu-grpo app`): runs.py and views.py are plain Python; ui.py, handlers.py and chat.py
import gradio and torch only inside functions."""
