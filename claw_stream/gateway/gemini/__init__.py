"""The Gemini API door (`/v1beta/models/{model}:generateContent`, Gemini CLI): translated to chat
and back."""
