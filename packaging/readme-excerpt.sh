#!/usr/bin/env bash
# readme-excerpt.sh README VERSION PLATFORM - print the README shipped in release tarballs and the .deb: the
# project README's introduction (up to its first "## " heading) and its install section (the "## " heading
# starting with "Install"), then where the full guide is. Fails if either part is missing, so a README
# reorganisation cannot silently ship an empty excerpt.
set -euo pipefail
usage="usage: $0 README VERSION PLATFORM"
README=${1:?$usage} VERSION=${2:?$usage} PLATFORM=${3:?$usage}

intro=$(awk '/^## /{exit} {print}' "$README")
install=$(awk '/^## /{on = ($0 ~ /^## Install/)} on {print}' "$README")
if [[ -z ${intro//[[:space:]]/} || -z ${install//[[:space:]]/} ]]; then
	echo "readme-excerpt.sh: $README has no introduction or no '## Install...' section" >&2
	exit 1
fi
printf '%s\n\n_Release %s for %s._\n\n%s\n\n' "$intro" "$VERSION" "$PLATFORM" "$install"
cat <<'TXT'
## More

INSTALL.md (next to this file) is the full guide: the hard-way install step by step, reload versus
restart, logs, switching from upstream kube-proxy and back, uninstalling, the .deb and the DaemonSet.
TXT
