#!/usr/bin/env bash
# Simulated hosts on real links: N network namespaces joined by veth pairs to one bridge, every link shaped with
# tc, and one torchrun (one rank) started in each. Run as root; everything it made is removed on exit (trap EXIT).
#
#   bench/netns.sh --hosts 2 --rate 1gbit -- train --profile quick --output-dir /tmp/run [train options]
#   bench/netns.sh --hosts 4 --rate 10gbit -- bench/netns_allreduce.py --params 134515008
#   bench/netns.sh --hosts 2 --rate 1gbit --loss 5 -- tests/train/dist_worker.py train OUT JSON
#   bench/netns.sh --hosts 3 --rate 1gbit --delay 20ms --sysctl net.ipv4.tcp_slow_start_after_idle=0 -- ...
#
# After `--`: `train ...` runs `cpu-grpo train --nnodes N --node-rank i --rdzv-endpoint ... ...` (which launches
# torchrun; --threads set to the host's share of the cores unless given); `X.py ...` runs `torchrun ... X.py ...`.
# Host i is namespace <prefix>h<i>, address 10.77.0.<i+1> on veth <prefix>v<i> (GLOO_SOCKET_IFNAME), joined to
# bridge <prefix>br by <prefix>b<i>; the rendezvous (c10d) is host 0's address, and host 0 holds its store. Each
# host's output is printed with a "[host i] " prefix; the exit code is the first non-zero one of the hosts.
#
# Links: --rate shapes both directions of every host's link with tbf (a full-duplex port of a switch). --loss drops
# that percentage of the packets a host sends (nftables numgen on the bridge's side of the link). --delay 20ms
# makes host-to-host one-way latency: the hosts' links are then TAP devices joined by bench/delaylink.py, a switch
# in user space that holds each frame that long (this kernel has no netem), shaped with tbf on the way out and on
# an ifb (<prefix>i<i>) on the way in; --loss is then the switch's. Cut a link from outside with
# `ip link set <prefix>b<i> down` (with --delay: `ip -n <prefix>h<i> link set <prefix>v<i> down`); kill a host
# with `ip netns pids <prefix>h<i> | xargs kill -9`.
set -euo pipefail

hosts=2 rate=1gbit delay="" loss="" prefix=cg port=29500 join_timeout=60 timeout=0 threads=0 absent=" " sysctls=()
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
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
    --sysctl) sysctls+=("$2"); shift 2 ;;      # KEY=VALUE set in every host (net.ipv4.tcp_wmem="4096 16384 33554432")
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

pids=() watchdog="" switch=""
cleanup() {
  set +e
  [[ -z $watchdog ]] || kill -- "-$watchdog" 2>/dev/null
  [[ -z $switch ]] || kill "$switch" 2>/dev/null  # its TAP devices go with it
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
shape() {  # shape DEV [NETNS]: tbf at --rate on DEV's egress
  local ns=()
  [[ -n ${2:-} ]] && ns=(-n "$2")
  tc "${ns[@]}" qdisc add dev "$1" root tbf rate "$rate" burst "$burst" latency 100ms
}

if [[ -n $delay ]]; then  # TAP devices and a switch in user space that delays every frame
  [[ $delay =~ ^[0-9.]+ms$ ]] || { echo "netns.sh: --delay like 20ms" >&2; exit 2; }
  taps=() hub=("$python" "$root/bench/delaylink.py" --delay-ms "${delay%ms}")
  [[ -z $loss ]] || hub+=(--loss "$loss")
  for i in $(seq 0 $((hosts - 1))); do taps+=("${prefix}v$i"); done
  coproc SWITCH { exec "${hub[@]}" "${taps[@]}" 2>&1; }
  switch=$SWITCH_PID
  read -r -t 10 ready <&"${SWITCH[0]}" && [[ $ready == ready ]] || {
    echo "netns.sh: bench/delaylink.py did not start: ${ready:-no answer}" >&2; exit 2; }
  for i in $(seq 0 $((hosts - 1))); do
    ns=${prefix}h$i v=${prefix}v$i ifb=${prefix}i$i
    ip netns add "$ns"
    ip link set "$v" netns "$ns"
    ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev "$v"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$v" up
    shape "$v" "$ns"  # what the host sends; what it receives, through an ifb:
    ip -n "$ns" link add "$ifb" type ifb
    ip -n "$ns" link set "$ifb" up
    shape "$ifb" "$ns"
    tc -n "$ns" qdisc add dev "$v" handle ffff: ingress
    tc -n "$ns" filter add dev "$v" parent ffff: protocol all u32 match u32 0 0 action mirred egress redirect dev "$ifb"
  done
else
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
fi

for i in $(seq 0 $((hosts - 1))); do
  for kv in "${sysctls[@]}"; do ip netns exec "${prefix}h$i" sysctl -q -w "$kv"; done
done

# ---------------------------------------------------------------------------------------------------- the hosts
train=0
if [[ $1 == train ]]; then  # `cpu-grpo train` launches torchrun itself (its --nnodes flags), as a user would
  shift
  train=1 what=(-m cpu_grpo train "$@")
  [[ " $* " == *" --threads "* ]] || what+=(--threads "$threads")
else
  what=("$@")
fi
for i in $(seq 0 $((hosts - 1))); do
  [[ $absent == *" $i "* ]] && { echo "netns.sh: host $i never joins (--absent)"; continue; }
  if (( train )); then
    launch=("$python" "${what[@]}" --nnodes "$hosts" --node-rank "$i" --rdzv-endpoint "10.77.0.1:$port"
            --rdzv-id "$prefix" --join-timeout "$join_timeout" --local-addr "10.77.0.$((i + 1))")
  else
    launch=("$python" -m torch.distributed.run --nnodes "$hosts" --nproc-per-node 1 --node-rank "$i" --max-restarts 0
            --local-addr "10.77.0.$((i + 1))" --rdzv-backend c10d --rdzv-endpoint "10.77.0.1:$port" --rdzv-id "$prefix"
            --rdzv-conf "join_timeout=$join_timeout,is_host=$(( i == 0 ))" "${what[@]}")
  fi
  first=$(( cores >= hosts ? i * cores / hosts : i % cores ))
  last=$(( cores >= hosts ? (i + 1) * cores / hosts - 1 : first ))
  setsid ip netns exec "${prefix}h$i" taskset -c "$first-$last" env GLOO_SOCKET_IFNAME="${prefix}v$i" \
    OMP_NUM_THREADS="$threads" NETNS_HOST="$i" NETNS_HOSTS="$hosts" PYTHONUNBUFFERED=1 \
    bash -c 'set -o pipefail; "$@" 2>&1 | sed -u "s/^/[host $NETNS_HOST] /"' _ \
    "${launch[@]}" &
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
