# unbounded-agent %preun (RPM). On erase ($1 is 0) stops the package's units
# where systemd runs and removes their enablement, the way the %systemd_preun
# macro does. On upgrade ($1 is 1 or more) it does nothing: the units keep
# running (the agent's own upgrade unit restarts what needs it).

# The package's units, with each template turned into a pattern that matches
# its loaded instances.
package_units_and_instances() {
	for f in /usr/lib/systemd/system/unbounded-*; do
		[ -f "$f" ] || continue
		n=${f##*/}
		case $n in
		*@.*) printf '%s ' "${n%%@.*}@*.${n#*@.}" ;;
		*) printf '%s ' "$n" ;;
		esac
	done
}

package_units() {
	for f in /usr/lib/systemd/system/unbounded-*; do
		[ -f "$f" ] || continue
		case ${f##*/} in *@.*) continue ;; esac
		printf '%s ' "${f##*/}"
	done
}

if [ "$1" -eq 0 ]; then
	if [ -d /run/systemd/system ]; then
		units=$(package_units_and_instances)
		# shellcheck disable=SC2086 # unit names have no blanks
		[ -z "$units" ] || systemctl stop $units || :
	fi
	units=$(package_units)
	# shellcheck disable=SC2086
	[ -z "$units" ] || systemctl --no-reload disable $units || :
fi
exit 0
