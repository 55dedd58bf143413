#!/usr/bin/env bash
# End-to-end test of xdhcp on a real Kubernetes cluster: kind + Multus, a
# dnsmasq DHCP server on the node bridge br-localnet, the xdhcp DaemonSet from
# manifests/, and a pod attached with the bridge plugin + xdhcp IPAM
# (manifests/examples/nad-bridge-dhcp.yaml). It checks that the pod gets a
# DHCP address, that the agent records it in k8s.ovn.org/pod-networks with
# "ipam_mode": "dhcp", that the lease is renewed, and that deleting the pod
# ends the lease at the agent.
#
# NEVER RUN. It needs Docker and a container registry, which the machines
# xdhcp is developed on do not have: it is written from reading (kind,
# Multus, the manifests) and has not been run once, here or anywhere, so it
# is not counted as tested. .github/workflows/e2e-kind.yml is set up to run
# it; no run of that workflow has been seen either. Locally:
#     cargo xtask e2e-kind        (or: bash hack/e2e-kind.sh)
#
# What it does not expect: a DHCPRELEASE at the server when the pod goes.
# The bridge plugin deletes the pod's veth before it calls IPAM DEL, and a
# kind node has no Open vSwitch, so the agent finds no uplink to send the
# RELEASE through; the lease stays at the server until it expires (README,
# "One behaviour to know").
#
# Needs: docker, kind, kubectl, curl, rustup on PATH. Environment:
#   XDHCP_BIN         prebuilt release agent binary (default: `cargo xtask build`,
#                     which builds the agent and the thin plugin)
#   XDHCP_PLUGIN_BIN  prebuilt thin plugin binary (default: built here for the
#                     host's musl target, as `cargo xtask build` builds it)
#   BASE_IMAGE  image the binary runs in; its glibc must be at least the build
#               host's (default debian:bookworm-slim; CI uses ubuntu:24.04)
#   KEEP=1      keep the cluster for debugging
set -euo pipefail

CLUSTER=${CLUSTER:-xdhcp-e2e}
BASE_IMAGE=${BASE_IMAGE:-debian:bookworm-slim}
MULTUS_VERSION=${MULTUS_VERSION:-v4.1.4}
CNI_PLUGINS_VERSION=${CNI_PLUGINS_VERSION:-v1.6.2}
NODE=${CLUSTER}-worker
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)

log() { printf '\n==> %s\n' "$*"; }
# The agent on the worker (the DaemonSet runs one on the control plane too).
AGENT_POD=
agent_pod() {
  kubectl -n xdhcp-system get pod -l app.kubernetes.io/name=xdhcp \
    --field-selector "spec.nodeName=$NODE" -o name | head -n1
}
fail() {
  printf 'FAIL: %s\n' "$*" >&2
  kubectl -n xdhcp-system logs "${AGENT_POD:-ds/xdhcp}" -c agent --tail=100 >&2 || true
  exit 1
}
cleanup() {
  rm -rf "$WORK"
  if [ "${KEEP:-0}" != 1 ]; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

for tool in docker kind kubectl curl rustup; do
  command -v "$tool" >/dev/null || { echo "e2e-kind: $tool is required" >&2; exit 1; }
done

log "images"
if [ -n "${XDHCP_BIN:-}" ]; then
  BIN=$XDHCP_BIN
else
  (cd "$ROOT" && cargo xtask build)
  BIN=$ROOT/target/release/xdhcp
fi
if [ -n "${XDHCP_PLUGIN_BIN:-}" ]; then
  PLUGIN=$XDHCP_PLUGIN_BIN
else
  # The thin plugin the image carries, built here so it is never a stale or
  # missing file: static, against musl, for the host's architecture (what
  # xtask/src/build.rs builds; a no-op after `cargo xtask build`).
  PLUGIN_TARGET=$(rustc -vV | sed -n 's/^host: \([^-]*\)-.*/\1/p')-unknown-linux-musl
  rustup target add "$PLUGIN_TARGET"
  (cd "$ROOT" && cargo build --release -p xdhcp-plugin --target "$PLUGIN_TARGET")
  PLUGIN=$ROOT/target/$PLUGIN_TARGET/release/xdhcp-plugin
fi
for f in "$BIN" "$PLUGIN"; do
  [ -x "$f" ] || { echo "e2e-kind: $f is not an executable file" >&2; exit 1; }
done
mkdir -p "$WORK/image"
cp "$BIN" "$WORK/image/xdhcp"
cp "$PLUGIN" "$WORK/image/xdhcp-plugin"
# The DaemonSet's image, from the repository's Containerfile (what `cargo
# xtask image` builds); loaded into the nodes, never pulled.
docker build -q -t localhost/xdhcp:latest --build-arg BASE_IMAGE="$BASE_IMAGE" \
  -f "$ROOT/Containerfile" "$WORK/image"
docker build -q -t localhost/dnsmasq:e2e - <<'EOF'
FROM debian:bookworm-slim
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends dnsmasq-base && rm -rf /var/lib/apt/lists/*
EOF

log "cluster"
kind create cluster --name "$CLUSTER" --wait 120s --config - <<'EOF'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
EOF
kind load docker-image --name "$CLUSTER" localhost/xdhcp:latest localhost/dnsmasq:e2e

# The reference bridge plugin (kind's node image ships only ptp/host-local/...).
curl -fsSL "https://github.com/containernetworking/plugins/releases/download/${CNI_PLUGINS_VERSION}/cni-plugins-linux-amd64-${CNI_PLUGINS_VERSION}.tgz" \
  | tar -xz -C "$WORK" ./bridge
docker cp "$WORK/bridge" "$NODE:/opt/cni/bin/bridge"
# bpffs for the agent's pins (kind nodes may not mount it), shared so the
# DaemonSet's Bidirectional mount works; then the localnet: a bridge on the
# worker with the DHCP server's address.
docker exec "$NODE" sh -ec '
  mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
  mount --make-shared /sys/fs/bpf
  ip link add br-localnet type bridge
  ip addr add 192.0.2.1/24 dev br-localnet
  ip link set br-localnet up'

kubectl apply -f "https://raw.githubusercontent.com/k8snetworkplumbingwg/multus-cni/${MULTUS_VERSION}/deployments/multus-daemonset.yml"
kubectl -n kube-system rollout status ds/kube-multus-ds --timeout=180s

log "xdhcp"
kubectl apply -k "$ROOT/manifests"
kubectl -n xdhcp-system rollout status ds/xdhcp --timeout=180s
docker exec "$NODE" test -x /opt/cni/bin/xdhcp || fail "init container did not install /opt/cni/bin/xdhcp"
docker exec "$NODE" test -x /opt/cni/bin/dhcp || fail "init container did not install /opt/cni/bin/dhcp"
AGENT_POD=$(agent_pod)
[ -n "$AGENT_POD" ] || fail "no xdhcp agent pod on $NODE"

log "DHCP server (dnsmasq on br-localnet, 2 minute leases)"
kubectl apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata: { name: dnsmasq, namespace: xdhcp-system }
spec:
  nodeName: $NODE
  hostNetwork: true
  containers:
    - name: dnsmasq
      image: localhost/dnsmasq:e2e
      imagePullPolicy: Never
      securityContext: { privileged: true }
      command: [dnsmasq, --keep-in-foreground, --log-facility=-, --log-dhcp, --conf-file=/dev/null,
                --port=0, --interface=br-localnet, --bind-interfaces, --dhcp-authoritative,
                --dhcp-range=192.0.2.100,192.0.2.200,255.255.255.0,2m, --dhcp-leasefile=/tmp/leases]
EOF
kubectl -n xdhcp-system wait pod/dnsmasq --for=condition=Ready --timeout=120s

log "pod on the DHCP network"
kubectl apply -f "$ROOT/manifests/examples/namespace.yaml" -f "$ROOT/manifests/examples/nad-bridge-dhcp.yaml"
kubectl apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: client
  namespace: dhcp-demo
  annotations: { k8s.v1.cni.cncf.io/networks: bridge-dhcp }
spec:
  nodeName: $NODE
  containers:
    - { name: c, image: busybox:1.36, command: [sleep, "3600"] }
EOF
kubectl -n dhcp-demo wait pod/client --for=condition=Ready --timeout=120s || fail "pod not ready"

ip=$(kubectl -n dhcp-demo exec client -- ip -o -f inet addr show dev net1 | awk '{print $4}')
echo "net1: $ip"
case "$ip" in 192.0.2.1[0-9][0-9]/24|192.0.2.200/24) ;; *) fail "net1 has no address from the DHCP range: '$ip'";; esac
kubectl -n dhcp-demo exec client -- ping -c 2 -W 2 192.0.2.1 >/dev/null || fail "no connectivity to the DHCP server"
annotation=$(kubectl -n dhcp-demo get pod client -o jsonpath='{.metadata.annotations.k8s\.ovn\.org/pod-networks}')
echo "pod-networks: $annotation"
grep -q '"ipam_mode":"dhcp"' <<<"$annotation" || fail "pod-networks annotation lacks ipam_mode dhcp"
grep -q "\"${ip%/*}/24\"" <<<"$annotation" || fail "pod-networks annotation lacks $ip"

log "renewal (T1 = 60s)"
sleep 75
acks=$(kubectl -n xdhcp-system logs dnsmasq | grep -c "DHCPACK(br-localnet) ${ip%/*} ")
[ "$acks" -ge 2 ] || fail "expected a renewal ACK for ${ip%/*}, dnsmasq logged $acks ACK(s)"

log "pod deleted: the agent ends the lease"
kubectl -n xdhcp-system exec "$AGENT_POD" -c agent -- xdhcp leases | grep -q " ${ip%/*}/" \
  || fail "the agent holds no lease for ${ip%/*} before the delete"
kubectl -n dhcp-demo delete pod client --wait=true --timeout=120s
sleep 2
if kubectl -n xdhcp-system exec "$AGENT_POD" -c agent -- xdhcp leases | grep -q " ${ip%/*}/"; then
  fail "the agent still holds the lease for ${ip%/*} after the pod was deleted"
fi
# No RELEASE is expected (see the header): the server keeps the lease until
# it expires. Said, not checked.
if kubectl -n xdhcp-system logs dnsmasq | grep -q "DHCPRELEASE(br-localnet) ${ip%/*} "; then
  echo "dnsmasq saw a DHCPRELEASE for ${ip%/*}"
else
  echo "no DHCPRELEASE (the veth was gone before IPAM DEL): dnsmasq keeps ${ip%/*} until it expires"
fi

log "PASS"
