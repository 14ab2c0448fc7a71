# Sourced by the setup-*.sh scripts: one stamped Python venv per set of pinned requirements.
# stamped_venv VENV CHECK REQ...: makes VENV with REQ installed from PyPI unless its stamp names the
# same requirements and VENV/CHECK is executable (a second run is instant). Installs Debian's
# python3-venv first where the system Python lacks venv/ensurepip. Prints nothing on success.
stamped_venv() {
  local venv=$1 check=$2
  shift 2
  local stamp="$venv/.gpuslice-stamp" want="$*"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/$check" ]; then
    return 0
  fi
  local py=${PYTHON:-python3}
  if ! "$py" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    # Debian's system python splits venv/ensurepip out into python3-venv.
    if command -v apt-get >/dev/null 2>&1; then
      apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    fi
  fi
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@"
  echo "$want" > "$stamp"
}
