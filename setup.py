"""Everything is in pyproject.toml but one file: `ts_trl_accelerate.pth`, which has to sit in site-packages itself.

It makes a refusal under `accelerate launch` one line and exit status 2 (see ts_trl/cli/launcher_exit.py). setuptools
puts files in a wheel's root for neither kind of install, so both commands add it: `build_py` for a wheel (`pip
install .`, `python -m build`), `editable_wheel` for `pip install -e .`.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = Path(__file__).parent / "ts_trl" / "cli" / "ts_trl_accelerate.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file(str(PTH), str(Path(self.build_lib, PTH.name)), preserve_mode=False)


class EditableWheelWithPth(editable_wheel):
    def _install_namespaces(self, installation_dir, pth_prefix):  # the one hook into the editable wheel's root folder
        super()._install_namespaces(installation_dir, pth_prefix)
        shutil.copyfile(PTH, Path(installation_dir, PTH.name))


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
