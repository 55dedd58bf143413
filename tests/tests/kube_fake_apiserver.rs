//! The Kubernetes side of xdhcp driven through the real `kube::Client`
//! against [`FakeApiServer`] — an in-process HTTP server implementing pods
//! GET/PATCH (with resourceVersion preconditions and injected faults) and
//! VMIs GET. **It is not a cluster**; tests are named `*_fake_apiserver`.

use std::net::Ipv4Addr;
use std::time::Duration;

use serde_json::json;
use xdhcp::kube::annotation::POD_NETWORKS_ANNOTATION;
use xdhcp::kube::{KubeClient, KubeMode, PodApi, PodApiError, PodNetworkEntry, RetryPolicy};
use xdhcp::workload::{MacSource, Workload};
use xdhcp_tests::fake_apiserver::{FakeApiServer, Fault, Op};

const NS: &str = "tenant";
const KEY: &str = "default/ovn-localnet-dhcp";

fn fast_retry(attempts: u32) -> RetryPolicy {
    RetryPolicy {
        attempts,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
    }
}

fn api(server: &FakeApiServer) -> PodApi {
    PodApi::Kube(KubeClient::new(server.client()).with_retry(fast_retry(5)))
}

fn entry() -> PodNetworkEntry {
    PodNetworkEntry::dhcp(
        Ipv4Addr::new(10, 1, 192, 213),
        24,
        "02:00:00:00:20:08".parse().unwrap(),
        &[Ipv4Addr::new(10, 1, 192, 1)],
    )
}

const OUR_ENTRY: &str = r#"{"ip_addresses":["10.1.192.213/24"],"mac_address":"02:00:00:00:20:08","gateway_ips":["10.1.192.1"],"role":"secondary","ipam_mode":"dhcp"}"#;
const DEFAULT_ENTRY: &str = r#"{"ip_addresses":["10.220.2.18/24"],"mac_address":"0a:58:0a:dc:02:12","gateway_ips":["10.220.2.1"],"role":"primary"}"#;

/// Bound the whole scenario so a missing reply fails instead of hanging.
async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("scenario timed out")
}

#[tokio::test]
async fn plain_pod_fake_apiserver() {
    within(Box::pin(async {
        let server = FakeApiServer::start().await;
        let uid = server.add_pod(NS, "web", &[("app", "web")], &[]);
        let api = api(&server);

        let pod = api.get_pod(NS, "web").await.unwrap();
        assert_eq!(pod.workload(), Workload::Pod);
        assert_eq!(pod.uid.as_deref(), Some(uid.as_str()));
        assert_eq!(pod.pod_networks, None);

        api.set_network_entry_for_uid(NS, "web", Some(&uid), KEY, entry())
            .await
            .unwrap();
        assert_eq!(
            server
                .annotation(NS, "web", POD_NETWORKS_ANNOTATION)
                .unwrap(),
            format!(r#"{{"{KEY}":{OUR_ENTRY}}}"#)
        );
        // One read and one merge patch carrying the resourceVersion it read.
        let reqs = server.requests();
        // get_pod, then the read-modify-write: GET + PATCH.
        assert_eq!(reqs.len(), 3, "{reqs:#?}");
        assert_eq!(reqs[1].op, Some(Op::GetPod));
        let patch = &reqs[2];
        assert_eq!(patch.op, Some(Op::PatchPod));
        assert_eq!(
            patch.content_type.as_deref(),
            Some("application/merge-patch+json")
        );
        assert!(patch.uri.contains("fieldManager=xdhcp"), "{}", patch.uri);
        // The version the pod had when it was read (the store's first write).
        let body = patch.body.as_ref().unwrap();
        assert_eq!(body["metadata"]["resourceVersion"], json!("101"));
        assert!(server.unexpected().is_empty());

        // Setting the same entry again is a read and no write.
        api.set_network_entry(NS, "web", KEY, entry())
            .await
            .unwrap();
        assert_eq!(server.count(Op::PatchPod), 1);
    }))
    .await;
}

#[tokio::test]
async fn vm_pod_classification_fake_apiserver() {
    within(Box::pin(async {
        let server = FakeApiServer::start().await;
        server.add_pod(
            NS,
            "virt-launcher-vm1-x7k2p",
            &[("kubevirt.io", "virt-launcher"), ("vm.kubevirt.io/name", "vm1")],
            &[],
        );
        server.put_vmi(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm1", "namespace": NS, "uid": "vmi-uid"},
            "spec": {
                "domain": {"devices": {"interfaces": [
                    {"name": "default", "masquerade": {}},
                    {"name": "dhcp", "bridge": {}}
                ]}},
                "networks": [
                    {"name": "default", "pod": {}},
                    {"name": "dhcp", "multus": {"networkName": KEY}}
                ]
            },
            "status": {"interfaces": [
                {"name": "dhcp", "mac": "02:00:00:00:20:08", "ipAddress": "10.1.192.213",
                 "ipAddresses": ["10.1.192.213"]}
            ]}
        }));
        // A launcher pod known only by its owner reference.
        server.put_pod(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "virt-launcher-vm2-abcde", "namespace": NS, "uid": "p2",
                "labels": {"kubevirt.io": "virt-launcher"},
                "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                                     "name": "vm2", "uid": "vmi2", "controller": true}]
            }
        }));
        let api = api(&server);

        let pod = api.get_pod(NS, "virt-launcher-vm1-x7k2p").await.unwrap();
        let Workload::Vm { vmi_name } = pod.workload() else {
            panic!("launcher pod classified as {:?}", pod.workload());
        };
        assert_eq!(vmi_name, "vm1");
        let vmi = api.get_vmi(NS, &vmi_name).await.unwrap().unwrap();
        let iface = vmi.interface_for_network(KEY).unwrap();
        assert_eq!(iface.name, "dhcp");
        // Migration target: the pod interface has a new MAC, the status keeps the old one.
        let (mac, source) = iface.resolve_mac("02:00:00:00:99:99".parse().unwrap());
        assert_eq!((mac.to_string().as_str(), source), ("02:00:00:00:20:08", MacSource::VmiStatus));
        assert_eq!(iface.status_ipv4, Some(Ipv4Addr::new(10, 1, 192, 213)));

        let pod2 = api.get_pod(NS, "virt-launcher-vm2-abcde").await.unwrap();
        assert_eq!(pod2.workload(), Workload::Vm { vmi_name: "vm2".into() });
        // No such VMI (first boot race, or deleted): None, not an error.
        assert!(api.get_vmi(NS, "vm2").await.unwrap().is_none());
        assert!(api.get_vmi(NS, "").await.unwrap().is_none());

        // VM pods get the annotation too.
        api.set_network_entry(NS, "virt-launcher-vm1-x7k2p", KEY, entry())
            .await
            .unwrap();
        assert!(server
            .annotation(NS, "virt-launcher-vm1-x7k2p", POD_NETWORKS_ANNOTATION)
            .unwrap()
            .contains(r#""ipam_mode":"dhcp""#));
        assert!(server.unexpected().is_empty());
    }))
    .await;
}

#[tokio::test]
async fn conflict_retries_then_success_fake_apiserver() {
    within(Box::pin(async {
        let server = FakeApiServer::start().await;
        server.add_pod(NS, "web", &[], &[(POD_NETWORKS_ANNOTATION, &format!(r#"{{"default":{DEFAULT_ENTRY}}}"#))]);
        // Two other writers race us: each changes the pod between our read
        // and our patch, so our precondition fails for real; then a plain 409.
        let foreign = |n: u32| Fault::ConcurrentWrite {
            key: POD_NETWORKS_ANNOTATION.into(),
            value: format!(r#"{{"default":{DEFAULT_ENTRY},"other/net{n}":{{"ip_addresses":["192.0.2.{n}/24"],"mac_address":"02:00:00:00:00:0{n}","role":"secondary"}}}}"#),
        };
        server.inject(Op::PatchPod, foreign(1));
        server.inject(Op::PatchPod, foreign(2));
        server.inject(Op::PatchPod, Fault::Status(409));
        let api = api(&server);
        api.set_network_entry(NS, "web", KEY, entry()).await.unwrap();

        assert_eq!(server.pending_faults(), 0);
        assert_eq!(server.count(Op::PatchPod), 4);
        // Each attempt re-read the pod: the retry wraps the read.
        assert_eq!(server.count(Op::GetPod), 4);
        let got = server.annotation(NS, "web", POD_NETWORKS_ANNOTATION).unwrap();
        // The last concurrent writer's entry survives next to ours and `default`.
        assert_eq!(
            got,
            format!(
                r#"{{"default":{DEFAULT_ENTRY},"{KEY}":{OUR_ENTRY},"other/net2":{{"ip_addresses":["192.0.2.2/24"],"mac_address":"02:00:00:00:00:02","role":"secondary"}}}}"#
            )
        );
        // Every patch carried the version of the read before it.
        let reqs = server.requests();
        for w in reqs.windows(2) {
            if w[1].op == Some(Op::PatchPod) {
                assert_eq!(w[0].op, Some(Op::GetPod));
            }
        }
    }))
    .await;
}

#[tokio::test]
async fn conflicts_exhausted_fake_apiserver() {
    within(Box::pin(async {
        let server = FakeApiServer::start().await;
        server.add_pod(NS, "web", &[], &[]);
        server.inject_n(Op::PatchPod, &Fault::Status(409), 10);
        let api = PodApi::Kube(KubeClient::new(server.client()).with_retry(fast_retry(3)));
        let err = api
            .set_network_entry(NS, "web", KEY, entry())
            .await
            .unwrap_err();
        assert!(
            matches!(err, PodApiError::ConflictsExhausted { attempts: 3, .. }),
            "{err}"
        );
        assert_eq!(err.http_status(), Some(409));
        let msg = err.to_string();
        assert!(
            msg.contains("tenant/web") && msg.contains("409") && msg.contains("3 attempts"),
            "{msg}"
        );
        assert_eq!(server.count(Op::PatchPod), 3);
        assert_eq!(server.annotation(NS, "web", POD_NETWORKS_ANNOTATION), None);
    }))
    .await;
}

#[tokio::test]
async fn preserves_default_and_other_networks_fake_apiserver() {
    within(Box::pin(async {
        let server = FakeApiServer::start().await;
        let other = r#"{"ip_addresses":["198.51.100.4/24"],"mac_address":"02:00:00:00:00:04","routes":[{"dest":"203.0.113.0/24","nextHop":"198.51.100.1"}],"tunnel_id":12,"role":"secondary"}"#;
        let existing = format!(r#"{{"default":{DEFAULT_ENTRY},"infra/other":{other}}}"#);
        server.add_pod(
            NS,
            "web",
            &[],
            &[(POD_NETWORKS_ANNOTATION, &existing), ("k8s.v1.cni.cncf.io/network-status", "[]")],
        );
        let api = api(&server);
        api.set_network_entry(NS, "web", KEY, entry()).await.unwrap();
        assert_eq!(
            server.annotation(NS, "web", POD_NETWORKS_ANNOTATION).unwrap(),
            format!(r#"{{"default":{DEFAULT_ENTRY},"{KEY}":{OUR_ENTRY},"infra/other":{other}}}"#)
        );
        // Other annotations are not touched (merge patch of one key only).
        assert_eq!(
            server.annotation(NS, "web", "k8s.v1.cni.cncf.io/network-status").as_deref(),
            Some("[]")
        );
        let patch = server
            .requests()
            .into_iter()
            .find(|r| r.op == Some(Op::PatchPod))
            .unwrap();
        let annotations = patch.body.unwrap()["metadata"]["annotations"].clone();
        assert_eq!(annotations.as_object().unwrap().len(), 1);
    }))
    .await;
}

#[tokio::test]
async fn removal_on_del_fake_apiserver() {
    within(Box::pin(async {
        let server = FakeApiServer::start().await;
        let existing = format!(r#"{{"default":{DEFAULT_ENTRY},"{KEY}":{OUR_ENTRY}}}"#);
        server.add_pod(NS, "web", &[], &[(POD_NETWORKS_ANNOTATION, &existing)]);
        let api = api(&server);
        api.remove_network_entry(NS, "web", KEY).await.unwrap();
        assert_eq!(
            server
                .annotation(NS, "web", POD_NETWORKS_ANNOTATION)
                .unwrap(),
            format!(r#"{{"default":{DEFAULT_ENTRY}}}"#)
        );
        // DEL is idempotent: nothing to remove → no write.
        api.remove_network_entry(NS, "web", KEY).await.unwrap();
        assert_eq!(server.count(Op::PatchPod), 1);

        // Removing the only entry removes the annotation.
        server.add_pod(
            NS,
            "solo",
            &[],
            &[(
                POD_NETWORKS_ANNOTATION,
                &format!(r#"{{"{KEY}":{OUR_ENTRY}}}"#),
            )],
        );
        api.remove_network_entry(NS, "solo", KEY).await.unwrap();
        let pod = server.pod(NS, "solo").unwrap();
        assert!(pod["metadata"].get("annotations").is_none(), "{pod}");

        // The pod is already gone: success.
        server.delete_pod(NS, "web");
        api.remove_network_entry(NS, "web", KEY).await.unwrap();
        // A DEL for a pod since recreated under the same name leaves the new
        // pod's entry alone.
        let old_uid = server.add_pod(NS, "twin", &[], &[(POD_NETWORKS_ANNOTATION, &existing)]);
        server.delete_pod(NS, "twin");
        server.add_pod(NS, "twin", &[], &[(POD_NETWORKS_ANNOTATION, &existing)]);
        let patches = server.count(Op::PatchPod);
        api.remove_network_entry_for_uid(NS, "twin", Some(&old_uid), KEY)
            .await
            .unwrap();
        assert_eq!(server.count(Op::PatchPod), patches);
        assert_eq!(
            server
                .annotation(NS, "twin", POD_NETWORKS_ANNOTATION)
                .as_deref(),
            Some(existing.as_str())
        );
        // Conflicts on DEL are retried like on ADD.
        server.add_pod(NS, "again", &[], &[(POD_NETWORKS_ANNOTATION, &existing)]);
        server.inject(Op::PatchPod, Fault::Status(409));
        api.remove_network_entry(NS, "again", KEY).await.unwrap();
        assert_eq!(
            server
                .annotation(NS, "again", POD_NETWORKS_ANNOTATION)
                .unwrap(),
            format!(r#"{{"default":{DEFAULT_ENTRY}}}"#)
        );
    }))
    .await;
}

#[tokio::test]
async fn api_errors_name_pod_and_code_fake_apiserver() {
    within(Box::pin(async {
        let server = FakeApiServer::start().await;
        server.add_pod(NS, "web", &[], &[]);
        let api = api(&server);

        server.inject(Op::GetPod, Fault::Status(403));
        let err = api.get_pod(NS, "web").await.unwrap_err();
        assert_eq!(err.http_status(), Some(403));
        let msg = err.to_string();
        assert!(
            msg.contains("pod tenant/web") && msg.contains("HTTP 403"),
            "{msg}"
        );

        server.inject(Op::PatchPod, Fault::Status(500));
        let err = api
            .set_network_entry(NS, "web", KEY, entry())
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                PodApiError::Api {
                    op: "patch",
                    code: 500,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("pod tenant/web"), "{err}");
        // A 500 is not retried.
        assert_eq!(server.count(Op::PatchPod), 1);

        server.inject(Op::GetPod, Fault::Status(403));
        let err = api
            .set_network_entry(NS, "web", KEY, entry())
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                PodApiError::Api {
                    op: "get",
                    code: 403,
                    ..
                }
            ),
            "{err}"
        );

        let err = api
            .set_network_entry(NS, "missing", KEY, entry())
            .await
            .unwrap_err();
        assert_eq!(err.http_status(), Some(404));
        assert!(err.to_string().contains("pod tenant/missing"), "{err}");
        let err = api.get_pod(NS, "missing").await.unwrap_err();
        assert_eq!(err.http_status(), Some(404));

        server.inject(Op::GetVmi, Fault::Status(403));
        let err = api.get_vmi(NS, "vm1").await.unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("VirtualMachineInstance tenant/vm1") && msg.contains("403"),
            "{msg}"
        );

        // Nothing was written by any failed call.
        assert_eq!(server.annotation(NS, "web", POD_NETWORKS_ANNOTATION), None);
    }))
    .await;
}

#[tokio::test]
async fn recreated_pod_is_not_patched_fake_apiserver() {
    within(Box::pin(async {
        let server = FakeApiServer::start().await;
        let old_uid = server.add_pod(NS, "web", &[], &[]);
        server.delete_pod(NS, "web");
        server.add_pod(NS, "web", &[], &[]);
        let api = api(&server);
        let err = api
            .set_network_entry_for_uid(NS, "web", Some(&old_uid), KEY, entry())
            .await
            .unwrap_err();
        assert!(matches!(err, PodApiError::UidMismatch { .. }), "{err}");
        assert_eq!(server.count(Op::PatchPod), 0);
    }))
    .await;
}

#[tokio::test]
async fn malformed_annotation_is_not_overwritten_fake_apiserver() {
    within(Box::pin(async {
        let server = FakeApiServer::start().await;
        server.add_pod(NS, "web", &[], &[(POD_NETWORKS_ANNOTATION, "{broken")]);
        let api = api(&server);
        let err = api
            .set_network_entry(NS, "web", KEY, entry())
            .await
            .unwrap_err();
        assert!(matches!(err, PodApiError::Annotation { .. }), "{err}");
        assert!(err.to_string().contains("tenant/web"), "{err}");
        assert_eq!(server.count(Op::PatchPod), 0);
        assert_eq!(
            server
                .annotation(NS, "web", POD_NETWORKS_ANNOTATION)
                .as_deref(),
            Some("{broken")
        );
    }))
    .await;
}

#[tokio::test]
async fn unreachable_server_is_a_transport_error_fake_apiserver() {
    within(Box::pin(async {
        let mut server = FakeApiServer::start().await;
        let api = api(&server);
        server.stop();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let err = api.get_pod(NS, "web").await.unwrap_err();
        assert!(matches!(err, PodApiError::Transport { .. }), "{err}");
        assert!(err.to_string().contains("pod tenant/web"), "{err}");
        assert_eq!(err.http_status(), None);
    }))
    .await;
}

#[tokio::test]
async fn kubeconfig_file_selects_the_api_fake_apiserver() {
    within(Box::pin(async {
        let server = FakeApiServer::start().await;
        server.add_pod(NS, "web", &[("app", "web")], &[]);
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
                 clusters:\n- name: fake\n  cluster:\n    server: {}\n\
                 contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: nobody\n\
                 users:\n- name: nobody\n  user: {{}}\n",
                server.url()
            ),
        )
        .unwrap();
        let api = PodApi::connect_with_kubeconfig(KubeMode::Auto, Some(&kubeconfig), dir.path())
            .await
            .unwrap();
        assert!(api.is_kube());
        assert_eq!(
            api.get_pod(NS, "web").await.unwrap().workload(),
            Workload::Pod
        );
        // --kube=off wins over any kubeconfig.
        let off = PodApi::connect_with_kubeconfig(KubeMode::Off, Some(&kubeconfig), dir.path())
            .await
            .unwrap();
        assert!(!off.is_kube());
        // --kube=on with a broken kubeconfig is a configuration error.
        std::fs::write(&kubeconfig, "not: [a, kubeconfig").unwrap();
        let err = PodApi::connect_with_kubeconfig(KubeMode::On, Some(&kubeconfig), dir.path())
            .await
            .unwrap_err();
        assert!(matches!(err, PodApiError::Config { .. }), "{err}");
        assert!(err.to_string().contains("kubeconfig"), "{err}");
    }))
    .await;
}

#[tokio::test]
async fn hung_api_server_times_out_fake_apiserver() {
    within(Box::pin(async {
        let server = FakeApiServer::start().await;
        server.add_pod(NS, "web", &[], &[]);
        let mut config = kube::Config::new(server.url().parse().unwrap());
        config.read_timeout = Some(Duration::from_millis(300));
        let api = PodApi::Kube(KubeClient::from_config(config).unwrap());
        server.inject(Op::PatchPod, Fault::Delay(Duration::from_secs(3)));
        let started = std::time::Instant::now();
        let err = api
            .set_network_entry(NS, "web", KEY, entry())
            .await
            .unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert!(
            matches!(err, PodApiError::Transport { op: "patch", .. }),
            "{err}"
        );
        assert!(err.to_string().contains("pod tenant/web"), "{err}");
    }))
    .await;
}

#[tokio::test]
async fn the_write_carries_the_uid_and_a_recreated_pod_refuses_it_fake_apiserver() {
    within(Box::pin(async {
        let server = FakeApiServer::start().await;
        let uid = server.add_pod(NS, "web", &[], &[]);
        let api = api(&server);
        api.set_network_entry_for_uid(NS, "web", Some(&uid), KEY, entry())
            .await
            .unwrap();
        let patch = server
            .requests()
            .into_iter()
            .find(|r| r.op == Some(Op::PatchPod))
            .unwrap();
        assert_eq!(patch.body.unwrap()["metadata"]["uid"], json!(uid));

        // The API server's answer to a patch naming another UID: 422, the
        // field is immutable (what the agent relies on besides its read).
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(server.client(), NS);
        let err = pods
            .patch(
                "web",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&json!({"metadata": {"uid": "someone-else",
                    "annotations": {"x": "y"}}})),
            )
            .await
            .unwrap_err();
        let kube::Error::Api(status) = err else {
            panic!("{err}")
        };
        assert_eq!(status.code, 422, "{status:?}");
        assert!(status.message.contains("metadata.uid"), "{status:?}");
        assert_eq!(server.annotation(NS, "web", "x"), None);

        // A sandbox whose network namespace is gone: nothing written.
        let dir = tempfile::tempdir().unwrap();
        let guard = xdhcp::kube::WriteGuard {
            uid: Some(uid.clone()),
            netns: Some(dir.path().join("cni-gone")),
        };
        let patches = server.count(Op::PatchPod);
        let err = api
            .set_network_entry_guarded(NS, "web", &guard, "other/net", entry())
            .await
            .unwrap_err();
        assert!(matches!(err, PodApiError::SandboxGone { .. }), "{err}");
        assert!(err.to_string().contains("tenant/web"), "{err}");
        assert_eq!(server.count(Op::PatchPod), patches);
    }))
    .await;
}

#[tokio::test]
async fn migration_objects_fake_apiserver() {
    within(Box::pin(async {
        let server = FakeApiServer::start().await;
        server.put_vmim(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
            "metadata": {"name": "mig1", "namespace": NS, "uid": "mig-uid-1"},
            "spec": {"vmiName": "vm1"},
            "status": {"phase": "Scheduling", "migrationState": {"sourcePod": "virt-launcher-vm1-a"}}
        }));
        server.put_pod(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "virt-launcher-vm1-b", "namespace": NS, "uid": "p-b",
                "labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": "vm1",
                           "kubevirt.io/migrationJobUID": "mig-uid-1"},
                "annotations": {"kubevirt.io/migrationJobName": "mig1"}
            }
        }));
        let api = api(&server);
        let pod = api.get_pod(NS, "virt-launcher-vm1-b").await.unwrap();
        let target = pod.migration_target().expect("a migration target");
        assert_eq!(target.migration_uid, "mig-uid-1");
        assert_eq!(target.migration_name.as_deref(), Some("mig1"));
        let mig = api.get_migration(NS, "mig1").await.unwrap().unwrap();
        assert_eq!(mig.uid.as_deref(), Some("mig-uid-1"));
        assert_eq!(mig.source_pod.as_deref(), Some("virt-launcher-vm1-a"));
        assert!(api.get_migration(NS, "gone").await.unwrap().is_none());
        server.inject(Op::GetVmim, Fault::Status(403));
        let err = api.get_migration(NS, "mig1").await.unwrap_err();
        assert_eq!(err.http_status(), Some(403));
        assert!(
            err.to_string()
                .contains("VirtualMachineInstanceMigration tenant/mig1"),
            "{err}"
        );
        assert!(server.unexpected().is_empty());
    }))
    .await;
}

/// A client scoped to its node (`--node-name`) writes only pods scheduled
/// there: a write for a pod of another node is refused after the read,
/// before any PATCH, naming both nodes; a DEL's removal leaves such a pod
/// alone; the same write for a pod of its own node lands.
#[tokio::test]
async fn writes_for_a_pod_of_another_node_are_refused_fake_apiserver() {
    within(Box::pin(async {
        let server = FakeApiServer::start().await;
        server.put_pod(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "elsewhere", "namespace": NS, "uid": "u-else",
                         "annotations": {POD_NETWORKS_ANNOTATION: format!(r#"{{"{KEY}":{OUR_ENTRY}}}"#)}},
            "spec": {"nodeName": "node-b", "containers": [{"name": "c", "image": "registry.invalid/c"}]}
        }));
        let here = server.add_pod(NS, "here", &[], &[]);
        let api = PodApi::Kube(
            KubeClient::new(server.client())
                .with_retry(fast_retry(5))
                .with_node(xdhcp_tests::fake_apiserver::NODE),
        );
        let err = api
            .set_network_entry_for_uid(NS, "elsewhere", Some("u-else"), KEY, entry())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, PodApiError::OtherNode { theirs: Some(t), .. } if t == "node-b"),
            "{err}"
        );
        assert!(err.to_string().contains("node-b"), "{err}");
        assert_eq!(server.count(Op::PatchPod), 0);
        api.remove_network_entry(NS, "elsewhere", KEY).await.unwrap();
        assert_eq!(server.count(Op::PatchPod), 0);
        assert!(
            server
                .annotation(NS, "elsewhere", POD_NETWORKS_ANNOTATION)
                .unwrap()
                .contains(KEY)
        );
        api.set_network_entry_for_uid(NS, "here", Some(&here), KEY, entry())
            .await
            .unwrap();
        assert_eq!(server.count(Op::PatchPod), 1);
    }))
    .await;
}
