# Sourced (not run) by the scripts that go to a lent device machine, experiments/gpu_check.sh and
# experiments/table3_device.sh: the Python they run and the packages the device image lacks.
#
#   device_python DIR   PY := ${PYTHON:-python3}'s full path; DIR/bin/python on PATH, a script
#                       that execs PY (a `python` symlink to a virtualenv's python3, as the
#                       image's /opt/torch/.venv/bin/python3 is, would start outside that
#                       virtualenv, without its packages; quickstart.sh and the sweep's
#                       children call `python` or sys.executable); PYTHONUNBUFFERED=1.
#   device_wheels DIR   installs experiments/wheels/<module>-*.whl (experiments/gpu_wheels.sh
#                       made them) into DIR/site for each of ml_collections, sacremoses and
#                       tensorboardX that does not import, and puts DIR/site on PYTHONPATH;
#                       returns 1, saying why on stderr, when a module has no wheel or the
#                       wheels do not install.

device_python() {
  PY=$(command -v "${PYTHON:-python3}") || { echo "no ${PYTHON:-python3} on PATH" >&2; return 1; }
  mkdir -p "$1/bin"
  printf '#!/bin/sh\nexec "%s" "$@"\n' "$PY" >"$1/bin/python"
  chmod +x "$1/bin/python"
  export PATH="$1/bin:$PATH" PYTHONUNBUFFERED=1
}

device_wheels() {
  local module wheel missing=()
  for module in ml_collections sacremoses tensorboardX; do
    "$PY" -c "import $module" 2>/dev/null && continue
    shopt -s nullglob nocaseglob
    wheel=(experiments/wheels/"$module"-*.whl)
    shopt -u nullglob nocaseglob
    if (( ${#wheel[@]} != 1 )); then
      echo "$module does not import and experiments/wheels has no wheel of it: run" \
        "experiments/gpu_wheels.sh where pip works, and carry experiments/wheels" >&2
      return 1
    fi
    missing+=("${wheel[0]}")
  done
  (( ${#missing[@]} )) || return 0
  echo "installing ${missing[*]}" >&2
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$1/site" "${missing[@]}" \
    >&2 || { echo "the wheels did not install" >&2; return 1; }
  export PYTHONPATH="$1/site${PYTHONPATH:+:$PYTHONPATH}"
}
