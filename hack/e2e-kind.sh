#!/usr/bin/env bash
# End-to-end test of xdhcp on a real Kubernetes cluster: kind + Multus, a
# dnsmasq DHCP server on the node bridge br-localnet, the xdhcp DaemonSet from
# manifests/, and a pod attached with the bridge plugin + xdhcp IPAM
# (manifests/examples/nad-bridge-dhcp.yaml). It checks that the pod gets a
# DHCP address, that the agent records it in k8s.ovn.org/pod-networks with
# "ipam_mode": "dhcp", that the lease is renewed, and that deleting the pod
# releases it.
#
# NOT RUN IN THE DEVELOPMENT SANDBOX: it needs Docker, which the machines
# xdhcp is developed on do not have. It has never been run there and is not
# counted as tested. CI runs it (.github/workflows/e2e-kind.yml); locally:
#     cargo xtask e2e-kind        (or: bash hack/e2e-kind.sh)
#
# Needs: docker, kind, kubectl, curl on PATH. Environment:
#   XDHCP_BIN   prebuilt release binary (default: build with `cargo xtask build`)
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
fail() { printf 'FAIL: %s\n' "$*" >&2; kubectl -n xdhcp-system logs ds/xdhcp --tail=100 >&2 || true; exit 1; }
cleanup() {
  rm -rf "$WORK"
  if [ "${KEEP:-0}" != 1 ]; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

for tool in docker kind kubectl curl; do
  command -v "$tool" >/dev/null || { echo "e2e-kind: $tool is required" >&2; exit 1; }
done

log "images"
BIN=${XDHCP_BIN:-}
if [ -z "$BIN" ]; then
  (cd "$ROOT" && cargo xtask build)
  BIN=$ROOT/target/release/xdhcp
fi
mkdir -p "$WORK/image"
cp "$BIN" "$WORK/image/xdhcp"
cp "${XDHCP_PLUGIN_BIN:-$ROOT/target/x86_64-unknown-linux-musl/release/xdhcp-plugin}" "$WORK/image/xdhcp-plugin"
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

log "release on delete"
kubectl -n dhcp-demo delete pod client --wait=true --timeout=120s
sleep 2
kubectl -n xdhcp-system logs dnsmasq | grep -q "DHCPRELEASE(br-localnet) ${ip%/*} " \
  || fail "dnsmasq saw no DHCPRELEASE for ${ip%/*}"

log "PASS"
