"""What the tests share, in one place: each module a helper some test files import as `from helpers import NAME`
(tests/ is on the path, as pytest puts a rootdir conftest's folder there); none is a test file itself.

- foreign.py: models the kit did not write (the planners held against them)
- jupyter_browser.py: JupyterLab from the kit's venv, driven in Chromium through Playwright
- run_all.py: Run All as JupyterLab runs it, on a student notebook (also a script: `python tests/helpers/run_all.py`)
- hub.py: JupyterHub booted for a few students, each in a home of their own
- hubenv.py: a hub image's Python, and the README's hub commands run in a clone
- classroom.py: a class of hub homes in the states an instructor meets, and the gradebook they must give
"""
