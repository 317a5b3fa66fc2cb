"""Skills: short natural-language lessons an agent's model is given in its prompt ("Answer in
under 30 words."), learned from what users said and what the judge hinted, so an agent gets
better the same minute, without training (docs/concepts/skills.md).

Pure parts live here, shared by the services: the settings (`config.py`), whose lesson a skill
is (`scope.py`) and the text rules (`text.py`: near-duplicates, the marked block, where it goes
in a prompt). The worker learns them (`worker/stages/skills.py`), the gateway adds them
(`gateway/skills.py`), Postgres keeps them (`store/skills.py`).
"""
