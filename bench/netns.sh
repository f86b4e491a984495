#!/usr/bin/env bash
# Simulated hosts on real links: N network namespaces joined by veth pairs to one bridge, every link shaped with
# tc, and one torchrun (one rank) started in each. Run as root; everything it made is removed on exit (trap EXIT).
#
#   bench/netns.sh --hosts 2 --rate 1gbit -- train --profile quick --output-dir /tmp/run [train options]
#   bench/netns.sh --hosts 4 --rate 10gbit -- bench/netns_allreduce.py --params 134515008
#   bench/netns.sh --hosts 2 --rate 1gbit --loss 5 -- tests/train/dist_worker.py train OUT JSON
#
# After `--`: `train ...` runs `torchrun ... -m cpu_grpo train ...` (with --threads set to the host's share of the
# cores unless given); `X.py ...` runs `torchrun ... X.py ...`. Host i is namespace <prefix>h<i>, address
# 10.77.0.<i+1> on veth <prefix>v<i> (GLOO_SOCKET_IFNAME), joined to bridge <prefix>br by <prefix>b<i>; the
# rendezvous (c10d) is host 0's address, and host 0 holds its store. Each host's output is printed with a "[host i] " prefix; the exit code is
# the first non-zero one of the hosts.
#
# Links: --rate shapes both directions of every host's link with tbf (a full-duplex port of a switch). --delay
# adds one-way latency on each host's egress (netem; host to host one-way = delay), --loss drops that percentage of
# the packets a host sends (nftables numgen on the bridge's side of the link). Cut a link from outside with
# `ip link set <prefix>b<i> down`; kill a host with `ip netns pids <prefix>h<i> | xargs kill -9`.
set -euo pipefail

hosts=2 rate=1gbit delay="" loss="" prefix=cg port=29500 join_timeout=60 timeout=0 threads=0 absent=" "
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --loss) loss=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;            # names of namespaces, links and bridge (several setups at once)
    --port) port=$2; shift 2 ;;
    --join-timeout) join_timeout=$2; shift 2 ;;  # seconds torchrun waits for every host to join the rendezvous
    --timeout) timeout=$2; shift 2 ;;          # kill every host after this many seconds (0: never)
    --threads) threads=$2; shift 2 ;;          # torch threads a host (0: its share of this machine's cores)
    --absent) absent+="$2 "; shift 2 ;;        # this host's namespace is made, but nothing runs in it
    -h|--help) usage ;;
    --) shift; break ;;
    *) echo "netns.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $# -gt 0 ]] || { echo "netns.sh: give the command after --" >&2; usage 2; }
[[ $EUID -eq 0 ]] || { echo "netns.sh: run as root (it makes network namespaces)" >&2; exit 2; }
(( hosts >= 2 && hosts <= 4 )) || { echo "netns.sh: --hosts must be 2 to 4" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
[[ -x $python ]] || python=python3
cores=$(nproc)
(( threads > 0 )) || threads=$(( cores / hosts > 0 ? cores / hosts : 1 ))

pids=() watchdog=""
cleanup() {
  set +e
  [[ -z $watchdog ]] || kill -- "-$watchdog" 2>/dev/null
  for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done
  for i in $(seq 0 $((hosts - 1))); do
    for pid in $(ip netns pids "${prefix}h$i" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    ip netns del "${prefix}h$i" 2>/dev/null   # removes the veth pair with it
  done
  ip link del "${prefix}br" 2>/dev/null
  nft delete table netdev "${prefix}loss" 2>/dev/null
  wait "${pids[@]}" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------------------- the network
rate_bytes() {  # 1gbit -> bytes per second
  local n=${1%%[a-z]*} unit=${1##*[0-9.]}
  case "$unit" in
    gbit) echo $(( n * 125000000 )) ;; mbit) echo $(( n * 125000 )) ;; kbit) echo $(( n * 125 )) ;;
    *) echo "netns.sh: --rate like 1gbit, 100mbit" >&2; exit 2 ;;
  esac
}
bps=$(rate_bytes "$rate")
burst=$(( bps / 500 > 65536 ? bps / 500 : 65536 ))  # 2 ms of traffic, at least 64 KB (a GSO segment)
shape() {  # shape DEV [NETNS]: tbf at --rate on DEV's egress, netem --delay in front of it where asked
  local ns=()
  [[ -n ${2:-} ]] && ns=(-n "$2")
  if [[ -n $delay ]]; then
    tc "${ns[@]}" qdisc add dev "$1" root handle 1: netem delay "$delay" limit 1000000 || {
      echo "netns.sh: --delay needs netem, which this kernel lacks (CONFIG_NET_SCH_NETEM)" >&2; exit 2; }
    tc "${ns[@]}" qdisc add dev "$1" parent 1: handle 2: tbf rate "$rate" burst "$burst" latency 100ms
  else
    tc "${ns[@]}" qdisc add dev "$1" root tbf rate "$rate" burst "$burst" latency 100ms
  fi
}

ip link add "${prefix}br" type bridge
ip link set "${prefix}br" up
if [[ -n $loss ]]; then
  command -v nft >/dev/null || { echo "netns.sh: --loss needs nft (apt-get install nftables)" >&2; exit 2; }
  nft add table netdev "${prefix}loss"
fi
for i in $(seq 0 $((hosts - 1))); do
  ns=${prefix}h$i v=${prefix}v$i b=${prefix}b$i
  ip netns add "$ns"
  ip link add "$v" type veth peer name "$b"
  ip link set "$v" netns "$ns"
  ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev "$v"
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "$v" up
  ip link set "$b" master "${prefix}br" up
  shape "$v" "$ns"  # what the host sends
  shape "$b"        # what it receives
  if [[ -n $loss ]]; then  # the host's outgoing packets, as they reach the switch
    nft add chain netdev "${prefix}loss" "h$i" "{ type filter hook ingress device $b priority 0; }"
    nft add rule netdev "${prefix}loss" "h$i" numgen random mod 10000 "<" "$(awk "BEGIN{print int($loss * 100)}")" drop
  fi
done

# ---------------------------------------------------------------------------------------------------- the hosts
if [[ $1 == train ]]; then
  shift
  what=(-m cpu_grpo train "$@")
  [[ " $* " == *" --threads "* ]] || what+=(--threads "$threads")
else
  what=("$@")
fi
for i in $(seq 0 $((hosts - 1))); do
  [[ $absent == *" $i "* ]] && { echo "netns.sh: host $i never joins (--absent)"; continue; }
  first=$(( cores >= hosts ? i * cores / hosts : i % cores ))
  last=$(( cores >= hosts ? (i + 1) * cores / hosts - 1 : first ))
  setsid ip netns exec "${prefix}h$i" taskset -c "$first-$last" env GLOO_SOCKET_IFNAME="${prefix}v$i" \
    OMP_NUM_THREADS="$threads" NETNS_HOST="$i" NETNS_HOSTS="$hosts" PYTHONUNBUFFERED=1 \
    bash -c 'set -o pipefail; "$@" 2>&1 | sed -u "s/^/[host $NETNS_HOST] /"' _ \
    "$python" -m torch.distributed.run --nnodes "$hosts" --nproc-per-node 1 --node-rank "$i" --max-restarts 0 --local-addr "10.77.0.$((i + 1))" \
    --rdzv-backend c10d --rdzv-endpoint "10.77.0.1:$port" --rdzv-id "$prefix" \
    --rdzv-conf "join_timeout=$join_timeout,is_host=$(( i == 0 ))" "${what[@]}" &
  pids+=("$!")
done
if (( timeout > 0 )); then
  # in its own process group, so that cleanup ends its sleep too (a sleep left behind holds our stdout open)
  setsid bash -c 'sleep "$1"; echo "netns.sh: --timeout $1 s: killing every host" >&2; shift
    for pid; do kill -KILL -- "-$pid" 2>/dev/null; done' _ "$timeout" "${pids[@]}" &
  watchdog=$!
fi
rc=0
for i in "${!pids[@]}"; do
  code=0
  wait "${pids[$i]}" || code=$?
  (( rc != 0 || code == 0 )) || rc=$code
done
exit "$rc"
