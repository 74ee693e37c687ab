# unbounded-agent %post (RPM). Starts nothing: an image builder installs the
# package without a running systemd, and the first boot with
# /etc/unbounded/agent.toml in place is what bootstraps the node.
#
# $1 is the number of installed instances of the package once this one is
# in: 1 on the first install, 2 or more on an upgrade.

# The package's units by name. Templates are left out: they take effect only
# through an instance, and presets name instances, not templates.
package_units() {
	for f in /usr/lib/systemd/system/unbounded-*; do
		[ -f "$f" ] || continue
		case ${f##*/} in *@.*) continue ;; esac
		printf '%s ' "${f##*/}"
	done
}

if [ "$1" -eq 1 ]; then
	# Presets are the distribution's way to say what is enabled;
	# `systemctl preset` works without a running manager.
	units=$(package_units)
	if [ -n "$units" ]; then
		# shellcheck disable=SC2086 # unit names have no blanks
		systemctl --no-reload preset $units || echo "unbounded-agent: systemctl preset failed" >&2
	fi
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || :
	# /run/unbounded now rather than at the next boot (%tmpfiles_create).
	if command -v systemd-tmpfiles >/dev/null; then
		systemd-tmpfiles --create unbounded-agent.conf || :
	fi
fi
exit 0
