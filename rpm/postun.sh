# unbounded-agent %postun (RPM). Reloads systemd where it runs, so that it
# forgets the removed (or replaced) units. /var/lib/unbounded is kept when the
# agent has written state into it: it is the node's state, and
# `systemctl start unbounded-reset.service` is the way to remove a node
# completely.
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || :
fi
exit 0
