#!/bin/bash
# race.sh SECONDS: the companion, its owner, exports, imports, opens, listing and announced
# resets raced on the KASAN kernel (tests/system/companion.sh). Each loop counts its runs and
# how each run ended, so that the host can tell that the sides met: one record per loop,
#   @loop_NAME 0 runs=N OUTCOME=N...
# and the seconds they raced, "@race_seconds 0 N". The loops race for SECONDS, and on, all of
# them, for at most 180 s more, until each loop has run twice and seen each of the outcomes it
# needs (the host checks the same ones), so that a slow guest still meets every side.
hbm=0000:03:00.0 nic=0000:04:00.0 dev=/dev/peerdirect0 secs=$1
. /mnt/host/guest-lib.sh
build_probe
owned_by_vfio $hbm
load_companion_mode
start=$(date +%s)
end=$((start + secs)) deadline=$((start + secs + 180))
met=/tmp/race-met
mkdir -p $met
loops=7
going() { # before the end; or before the deadline while a loop has not met its other sides
	local now
	now=$(date +%s)
	[ "$now" -lt $end ] || { [ "$now" -lt $deadline ] && [ "$(ls $met | wc -l)" -lt $loops ]; }
}
loop() { # loop NAME "OUTCOME..." CMD...: runs CMD while going; CMD prints a word per outcome
	local name=$1 need=$2 runs=0 word all line
	local -A n=()
	shift 2
	while going; do
		for word in $("$@" 2>/dev/null); do n[$word]=$((${n[$word]:-0} + 1)); done
		runs=$((runs + 1))
		all=1
		for word in $need; do [ "${n[$word]:-0}" -ge 1 ] || all=0; done
		[ $all = 0 ] || [ $runs -lt 2 ] || touch $met/$name
	done
	# one write: the loops print at once
	line="@loop_$name 0 runs=$runs"
	for word in "${!n[@]}"; do line+=" $word=${n[$word]}"; done
	echo "$line"
}
# Outcomes: added / add_refused, removed / remove_refused. The companion is kept a second
# before its removal: each of the other loops' runs takes seconds on the KASAN kernel, and
# with an add at once followed by a remove they seldom found it there (2 of 13 runs), so the
# run went on for minutes until each loop had seen both.
add_remove() {
	if peerdirect companion add $hbm --bar 2 >/dev/null 2>&1; then echo added; else echo add_refused; fi
	sleep 1
	if peerdirect companion remove $hbm >/dev/null 2>&1; then echo removed; else echo remove_refused; fi
}
# Outcomes: unbound / unbind_refused (vfio-pci had no device), bound / not_bound
owner() {
	if echo $hbm 2>/dev/null >/sys/bus/pci/drivers/vfio-pci/unbind; then echo unbound; else echo unbind_refused; fi
	echo $hbm 2>/dev/null >/sys/bus/pci/drivers_probe
	case $(readlink /sys/bus/pci/devices/$hbm/driver) in
	*/vfio-pci) echo bound ;;
	*) echo not_bound ;;
	esac
}
# import MODE OFFSET LENGTH: an export of the range imported (attached, pinned if revocable,
# mapped, unmapped, detached) by the NIC. Outcomes: mapped; gone: the companion or its device
# went first (no device file, or ENODEV/ENXIO from the open, the export or the importer's
# attach, pin or map); busy: the export came during an announced reset (EBUSY); other
import() {
	local out
	out=$(/tmp/probe imp $dev "$2" "$3" "dev=$nic mode=$1 hbm=$hbm" 2>&1)
	case "$out " in
	*"attach=0 "*"map=0 "*) echo mapped ;;
	"export: ENODEV "|"export: No such file or directory "|"export: No such device or address "|\
	*"attach=-19 "*|*"pin=-19 "*|*"map=-19 "*) echo gone ;;
	"export: EBUSY ") echo busy ;;
	*) echo other ;;
	esac
}
# Outcomes: answered (INFO on an open file), gone (the device file would not open, or INFO
# says ENODEV), other
info() {
	local out rc
	out=$(sh -c "exec 7<$dev && /tmp/probe info 7" 2>/dev/null)
	rc=$?
	# sh exits non-zero, silent, when the redirection fails
	case $rc:$out in
	0:OK) echo answered ;;
	0:ENODEV | [1-9]*:) echo gone ;;
	*) echo other ;;
	esac
}
# Outcomes: listed (the companion), none (an empty list), failed
list() {
	local out
	if ! out=$(peerdirect devices --json 2>/dev/null); then
		echo failed
	elif grep -q '"companion"' <<<"$out"; then
		echo listed
	else
		echo none
	fi
}
# Outcomes: reset (announced, then done), refused (no companion, or one being removed);
# done_refused when it went between the two. The device itself is not reset: a reset takes
# longer than the companion lives here, and reset.sh resets it (with vfio-pci, which leaves
# memory decoding off after, so that imports here would never map again).
reset_cycle() {
	if peerdirect companion reset-prepare $hbm >/dev/null 2>&1; then
		if peerdirect companion reset-done $hbm >/dev/null 2>&1; then echo reset; else echo done_refused; fi
	else
		echo refused
	fi
}
# The outcomes each loop needs: those the host checks (tests/system/companion.sh).
loop add_remove "added removed" add_remove &
loop owner "unbound bound" owner &
loop import "mapped gone" import dynamic 0x200000 0x400000 &
loop pinned "mapped gone" import revocable 0x800000 0x200000 &
loop info "answered gone" info &
loop list "listed none" list &
loop reset "reset refused" reset_cycle &
wait
echo "@race_seconds 0 $(($(date +%s) - start))"
/tmp/probe cmd "release all" >/dev/null
rmmod peerdirect_importer
rmmod peerdirect
echo "@rmmod $? "
