#!/usr/bin/env bash
# Two guests, as two hosts: each with its own HBM device (its own backing file), peerdirect
# bound, and its own NIC; the NICs joined by UDP datagrams on the host's loopback (qemu/run
# --link), nothing else on the link. libfabric's tcp provider moves data between them
# (trixie's fi_pingpong, message endpoints, data checked), both guests' kernel logs are checked
# as one guest's are, and afterwards nothing is left on the host: no QEMU process, no backing
# file, no bound port. The base of the two-host demo (issue "make demo runs the main job").
. "$(dirname "$0")/../lib.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Plan: the two guests and the transfer (2), what is left on the host (3).
plan 5
# Both guests boot side by side: what they need is built once, first.
prebuild || true

# Two UDP ports the kernel says are free now.
read -r port0 port1 < <("$ROOT/scripts/free-udp-ports" 2)
# The temporary backings qemu/run makes for these two guests (named after them, so that
# other guests running on the host meanwhile do not count).
backings() { find /dev/shm -maxdepth 1 -name 'peerdirect-hbm*.node[01].*' | sort; }
backings >"$work/backings.before"

# The server takes one client; the client tries until the server listens (the guests boot
# side by side, not in step). 100 round trips of 64 KiB each way, data checked (-c).
mkdir -p "$work/node0" "$work/node1"
pingpong='fi_pingpong -p tcp -e msg -I 100 -S 65536 -c'
cat >"$work/node0/run.sh" <<EOF
cd /mnt/host
timeout 120 $pingpong >out 2>&1
echo \$? >rc
hostname >name
EOF
cat >"$work/node1/run.sh" <<EOF
cd /mnt/host
rc=1
for i in \$(seq 60); do
	timeout 60 $pingpong 10.0.9.1 >out 2>&1 && { rc=0; break; }
	rc=\$?
	sleep 1
done
echo \$rc >rc
hostname >name
EOF

start=$(date +%s)
guest --userland trixie --link "$port0:$port1" --addr 10.0.9.1/24 --name node0 \
	--share "$work/node0" --timeout 240 -- sh /mnt/host/run.sh >"$work/node0.log" 2>&1 &
pid0=$!
guest --userland trixie --link "$port1:$port0" --addr 10.0.9.2/24 --name node1 \
	--share "$work/node1" --timeout 240 -- sh /mnt/host/run.sh >"$work/node1.log" 2>&1 &
pid1=$!
rc0=0 rc1=0
wait $pid0 || rc0=$?
wait $pid1 || rc1=$?
took=$(($(date +%s) - start))

if [ $rc0 = 0 ] && [ $rc1 = 0 ] && [ "$(cat "$work/node0/name")" = node0 ] &&
	[ "$(cat "$work/node1/name")" = node1 ]; then
	ok "two guests boot side by side, as node0 and node1, and end cleanly (no kernel splat in either log; $took s)"
else
	not_ok "two guests boot side by side, as node0 and node1, and end cleanly" \
		"qemu/run exited $rc0 (node0) and $rc1 (node1) (99: kernel splat, 98: guest died, 124: timeout)" \
		"$(tail -15 "$work/node0.log")" "$(tail -15 "$work/node1.log")"
fi

# fi_pingpong prints a header ("bytes iters total time MB/sec ...") and a line per size.
moved() { [ "$(cat "$1/rc" 2>/dev/null)" = 0 ] && grep -Eq '^64k +100 ' "$1/out"; }
if moved "$work/node0" && moved "$work/node1"; then
	ok "libfabric tcp between the guests: 100 round trips of 64 KiB, data checked, on both ends"
	grep -E '^bytes|^64k' "$work/node1/out" | tr -s ' ' | sed 's/^/# client: /'
else
	not_ok "libfabric tcp between the guests: 100 round trips of 64 KiB, data checked, on both ends" \
		"node0 (server) exit $(cat "$work/node0/rc" 2>/dev/null || echo none):" "$(cat "$work/node0/out" 2>/dev/null)" \
		"node1 (client) exit $(cat "$work/node1/rc" 2>/dev/null || echo none):" "$(cat "$work/node1/out" 2>/dev/null)"
fi

left=$(grep -laE "local.port=($port0|$port1)" /proc/[0-9]*/cmdline 2>/dev/null || true)
check "no QEMU process is left" test -z "$left"
backings >"$work/backings.after"
check "no HBM backing file is left in /dev/shm" cmp -s "$work/backings.before" "$work/backings.after"
check "neither link port is still bound (both bind again)" python3 -c '
import socket, sys
for port in sys.argv[1:]:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).bind(("127.0.0.1", int(port)))' "$port0" "$port1"
