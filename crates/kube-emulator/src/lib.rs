//! A stateful Kubernetes API server emulator for tests, driven by the real `kubectl` and by
//! kube-rs. No real apiserver (kube-apiserver, k3s, kind, envtest) can run on the project's
//! machines; `shared/docs/kube-api-emulator.md` records the client contract this serves:
//! every endpoint, header and content type kubectl 1.32 and kube-rs send.
//!
//! [`KubeEmulator::start`] serves plain HTTP on 127.0.0.1 (port 0 by default) and writes a
//! kubeconfig pointing at itself; [`BlockingKubeEmulator`] does the same for synchronous
//! tests. The `kube-emulator` binary runs one for people (`--port`, `--kubeconfig`,
//! `--event-log-capacity`) until Ctrl-C or SIGTERM.
//!
//! ```no_run
//! use std::process::Command;
//!
//! use kube_emulator::BlockingKubeEmulator;
//!
//! let emu = BlockingKubeEmulator::start()?;
//! // kubectl caches discovery per host:port for hours, and a port is reused by the next
//! // emulator: give each one a cache of its own.
//! let cache = tempfile::tempdir()?;
//! let out = Command::new("kubectl")
//!     .args(["get", "namespaces", "-o", "name"])
//!     .env("KUBECONFIG", emu.kubeconfig_path())
//!     .env("KUBECACHEDIR", cache.path())
//!     .output()?;
//! assert!(String::from_utf8_lossy(&out.stdout).contains("namespace/default"));
//! // kube-rs: `kube::Config::from_custom_kubeconfig(Kubeconfig::read_from(path)?, ..)`, or
//! // `KubeEmulator::start().await` inside a tokio test.
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! The whole cluster lives in memory behind one lock, and is gone when the emulator is
//! dropped. The crate depends on no lyra crate: it emulates Kubernetes, whatever runs on it.
//!
//! # What it does
//! - Discovery (`/api`, `/apis`, group and group-version documents, `/version`) and
//!   `/openapi/v3` documents: each CRD's schema as the apiserver publishes it (a component
//!   schema with `apiVersion`, `kind`, a `metadata` reference to `ObjectMeta` and its
//!   `x-kubernetes-group-version-kind`, which the paths' operations name), so `kubectl explain
//!   <kind>[.field...]` prints fields, types and descriptions, and kubectl leaves validation to
//!   the server (`fieldValidation`). The root lists each document at a URL with a hash of
//!   it, served as cacheable for good (a stale hash redirects), so kubectl caches documents
//!   and still sees a CRD created, updated or deleted.
//! - Built-in `v1` Namespaces (with termination, and the `kubernetes.io/metadata.name` label
//!   the apiserver sets), ConfigMaps, Secrets (`stringData`), ServiceAccounts (a `default` one
//!   per namespace), Events, Services (a cluster IP, `type`, ports' `targetPort` and
//!   `protocol` defaulted), Endpoints, PersistentVolumeClaims, `apps/v1` Deployments
//!   (generation, status subresource, `replicas` and `strategy` defaulted),
//!   `rbac.authorization.k8s.io/v1` (Cluster)Roles and (Cluster)RoleBindings,
//!   `admissionregistration.k8s.io/v1` Validating and Mutating WebhookConfigurations,
//!   `networking.k8s.io/v1` NetworkPolicies, `coordination.k8s.io/v1` Leases, and
//!   `apiextensions.k8s.io/v1` CRDs, which register their kind at once (`Established`,
//!   `NamesAccepted`) and drop its objects when deleted. So `helm install` of a controller's
//!   chart (Deployment, Service, RBAC, webhook configuration, NetworkPolicy) is accepted.
//! - `events.k8s.io/v1` Events as a second view of the core Events, as on a real apiserver:
//!   one storage in the core form, renamed fields converted on every read and write. So what
//!   kube-rs's `Recorder` writes shows in `kubectl describe` and `kubectl get events`, and
//!   writes, field selectors (each view's own names) and watches work through either view.
//! - Create/get/list/update/patch (merge, JSON with `test`, apply, strategic)/delete
//!   with uid, generation (bumped on spec changes only), resourceVersion conflicts, the status
//!   subresource split, finalizers and `deletionTimestamp`, `dryRun=All`, label and field
//!   selectors, `limit`/`continue`, Tables from printer columns, standard `Status` errors.
//! - Server-side apply with field ownership, as helm 4 and `kubectl apply --server-side`
//!   need it: `metadata.managedFields` on every object a client wrote (`Apply` and `Update`
//!   entries per `fieldManager`, else the user agent's name; `FieldsV1`; a `subresource`
//!   for `/status`), shown by `kubectl get --show-managed-fields`. An apply owns its
//!   configuration's fields and removes those its manager applied before and omits now,
//!   unless another manager owns them; changing a field another manager owns is a 409
//!   conflict worded as the apiserver's, unless `force=true`, which takes it over. Other
//!   writes own what they set or change, taken from its owners. Labels and annotations are
//!   owned per key, other metadata (names, finalizers, owner references) never; a main
//!   endpoint's write never owns nor removes a status kept by its subresource. Maps nest; lists are
//!   atomic, but built-in kinds' lists with a strategic merge key (`containers`, `env`,
//!   `ports`, `volumes`, `webhooks`, `conditions`...) merge and are owned item by item
//!   (`k:{"name":"app"}`). Client-sent `managedFields` are ignored; an apply needs a
//!   `fieldManager` (422 without, as the apiserver).
//! - Watches replayed from a bounded event log (`410 Expired` beyond it), with
//!   `timeoutSeconds`, `sendInitialEvents` and selector-aware ADDED/DELETED transitions.
//! - CRD schemas: pruning (`x-kubernetes-preserve-unknown-fields` respected; `fieldValidation=
//!   Strict` turns unknown fields into 400, `Warn` into `Warning` headers), defaults, and
//!   validation with field paths in `422 Invalid` errors: `type` (with `nullable` and
//!   `x-kubernetes-int-or-string`), `required`, `enum`, bounds, `pattern`, lengths, item and
//!   property counts, `allOf`/`anyOf`/`oneOf`/`not`; on create, update, patch, apply and status
//!   writes (the whole object: `status` against its schema too).
//! - CEL rules (`x-kubernetes-validations`, evaluated by `kube-cel`, the engine of kube's `cel`
//!   feature), after the schema checks pass: `self`, `oldSelf` on updates (transition rules,
//!   skipped on create unless `optionalOldSelf`), `message`, `messageExpression`, `reason`
//!   and `fieldPath`, reported as the apiserver does
//!   (`spec: Invalid value: "object": <message>`; a runtime error such as a missing key fails
//!   the write too). A rule that does not compile is not enforced: the CRD write returns a
//!   `Warning` naming it (a real apiserver refuses such a CRD), and a rule using what the `cel`
//!   crate lacks (`cel.bind`, `sortBy`, two-variable comprehensions) is skipped with a log line
//!   (`tracing`): there the emulator accepts what a real server refuses. An update skips the
//!   rules of a top-level field it leaves unchanged (`spec` on a status write), as validation
//!   ratcheting does on 1.33+, unless they read `oldSelf` or the root has rules of its own.
//! - Validating admission webhooks (`ValidatingWebhookConfiguration`), called as the apiserver
//!   calls them: after the server's own admission (the object as it would be stored), with
//!   the store's lock released (a webhook may call the API), for CREATE, UPDATE and DELETE
//!   (each object of a collection delete) and subresources a rule names (`x/status`);
//!   `rules` (groups, versions, operations, resources with `*`, `*/*`, `x/*`, scope),
//!   `namespaceSelector` (against the namespace's labels), `objectSelector` (object or old
//!   object), `matchPolicy` (`Equivalent`: another served version of the kind); an
//!   `admission.k8s.io/v1` `AdmissionReview` POSTed over HTTPS (ring's rustls) to
//!   `clientConfig.url` or `.service`, which resolves through the Service's port to its
//!   `targetPort` and the address of its Endpoints (an Endpoints object alone will do), the
//!   certificate verified against `caBundle` for `<service>.<namespace>.svc`;
//!   `timeoutSeconds`; `failurePolicy`; refusals, failures and `warnings` answered with the
//!   apiserver's messages and codes. Webhook configurations are never sent to webhooks.
//! - An audit of every request by user ([`KubeEmulator::requests`], [`AuditRecord`]): a bearer
//!   token is taken as the user's name (no authentication), an `Impersonate-User` header
//!   (`kubectl --as`; kubectl sends no token over plain HTTP) names the user instead, neither
//!   is [`ANONYMOUS_ADMIN`]; resource requests are described as RBAC sees them (verb, group,
//!   resource, subresource, namespace, name; a list or watch of `metadata.name=N` is on N; a
//!   server-side apply that creates is a `create` and a `patch`, as the apiserver authorizes
//!   it), discovery and other non-resource requests by their path.
//! - Background ownerReference garbage collection when an owner is deleted.
//! - The apiserver's size limits, with its errors: request bodies over 3 MiB (413
//!   `RequestEntityTooLarge`, once the body is read: up to 48 MiB, beyond that at once),
//!   annotations over 256 KiB in all (422 on `metadata.annotations`,
//!   which is what stops a `kubectl apply` of a large object: its last-applied annotation),
//!   and objects over etcd's 1.5 MiB (500 `etcdserver: request is too large`, counted on the
//!   object's JSON). `events.k8s.io/v1` writes are validated as the apiserver does (required
//!   fields, length limits, an immutable note).
//! - Deep objects, as the apiserver takes them: request bodies nest up to 10,000 levels (400
//!   beyond), not `serde_json`'s default of 128. Handling such an object walks it
//!   recursively, so the server needs deep stacks: [`BlockingKubeEmulator`] and the binary run
//!   it on threads of [`THREAD_STACK`] bytes; a runtime of your own given to
//!   [`KubeEmulator::start`] should do the same if its tests store deep objects.
//!
//! # What it does not do
//! - No authentication, authorization (RBAC), TLS, mutating admission webhooks (their
//!   configurations are stored, never called), ValidatingAdmissionPolicies, or schema
//!   validation of built-in kinds; validating webhooks are sent only `admission.k8s.io/v1`
//!   reviews, an empty `caBundle` trusts nothing (the system's roots are not consulted), and a
//!   DELETE's webhook warnings are dropped; CRD schemas ignore `format`,
//!   `uniqueItems` and list-type uniqueness. No validation ratcheting: an update is checked
//!   whole, even fields it leaves unchanged. CEL's cost budget is not enforced.
//! - Built-in kinds publish only `apiVersion`, `kind` and `metadata` in `/openapi/v3`: `kubectl
//!   explain configmap.data` finds no field.
//! - No conversion: versions of a CRD differ only in `apiVersion` (`conversion: None`); the
//!   status subresource is on for all versions if any version declares it.
//! - Server-side apply ownership is a subset of structured-merge-diff's: no schema is read for
//!   it, so custom resources' lists are always atomic (`x-kubernetes-list-type: map|set` is
//!   not honoured), list items have one key field (a Service port by `port`, not with
//!   `protocol`), sets of scalars are atomic (no `v:` entries), and `managedFields` a client
//!   sends are ignored rather than taken (no clearing them with `[{}]`, no `kubectl replace`
//!   of ownership). Field sets are not converted between versions, a map a removal empties
//!   goes with it, and the server's own writes (a namespace's `default` ServiceAccount...)
//!   record no entry. A value nested more than 32 levels deep is owned whole, where the
//!   apiserver tracks each level: a `fieldsV1` as deep as the deepest object it takes would
//!   make that kind's lists unreadable to clients that bound nesting (kube-rs at 128).
//! - Strategic merge patch (and an apply of a built-in kind) knows merge keys by field name
//!   (`containers`, `env`, `volumes`, `webhooks` by `name`, `ports` by `port` or
//!   `containerPort`...), not from each kind's types; other lists are replaced, and CRs reject
//!   strategic merge patch with 415 as a real apiserver does.
//! - `propagationPolicy: Foreground` is treated as Background; deleting a CRD drops its
//!   objects at once, finalizers or not.
//! - Field selectors accept any dotted path (a real apiserver allows a per-kind list);
//!   list `resourceVersion`/`resourceVersionMatch` are ignored (lists are always current),
//!   continue tokens are not snapshots, bookmarks are sent only after `sendInitialEvents`.
//! - Built-in kinds are stored as given: no controllers run (a Deployment gets no pods or
//!   status, a Service no Endpoints), and RBAC objects grant nothing.
//! - Protobuf only for what `kubectl create namespace|configmap|secret|serviceaccount` and
//!   helm's release storage send (Secrets, `DeleteOptions`); responses are JSON; no `/openapi/v2` (kubectl asks for it only as protobuf), no aggregated
//!   discovery, no scale subresource, no YAML request bodies (kubectl and kube-rs send JSON).
//!
//! # How it is built
//! - `server`: the listener, the state behind its lock, the kubeconfig; `blocking` runs a
//!   server on a thread of its own.
//! - `api`: HTTP in and out: paths, query parameters and content types parsed, writes handed to
//!   `objects`, reads in `api::read`, answers as objects, lists, Tables or `Status` errors
//!   (`errors`, worded as the apiserver words them). `discovery` serves the discovery and
//!   health documents, `openapi` the OpenAPI ones, `watch` the watch streams, `protobuf` reads the few protobuf bodies
//!   kubectl sends.
//! - `api::admit` puts the validating webhooks (`webhooks`: matching, service resolution, the
//!   calls) between a write's dry run and the write; `audit` records every request.
//! - `objects`: what a write means, independent of HTTP, one concern a module (create, update,
//!   patch, field ownership, the status subresource, delete, cascades, admission, size
//!   limits). `store`: the objects, the global resourceVersion and the event log watches
//!   replay.
//! - `registry`: the served kinds and their versions; `builtins`: a fresh cluster's kinds;
//!   `crd`: what a CRD makes of its kind; `schema`: CRD schemas (compiled, then prune,
//!   defaults, validate, and `schema::cel` for the rules); `events`: the `events.k8s.io` view of core Events.
//! - `selectors`, `table`, `jsonpath`: label and field selectors, Tables from printer columns,
//!   the JSONPath subset those columns use.

mod api;
mod audit;
mod blocking;
mod builtins;
mod crd;
mod discovery;
mod errors;
mod events;
mod jsonpath;
mod objects;
mod openapi;
mod protobuf;
mod registry;
mod schema;
mod selectors;
mod server;
mod store;
mod table;
mod watch;
mod webhooks;

pub use api::MAX_JSON_DEPTH;
pub use audit::{ANONYMOUS_ADMIN, AuditRecord};
pub use blocking::BlockingKubeEmulator;

/// The stack of the server's threads in [`BlockingKubeEmulator`] and the binary: enough for
/// the recursive walks over an object nested [`MAX_JSON_DEPTH`] levels (reading, pruning,
/// validating, writing, dropping it), in a debug build. Reserved, not committed, memory.
pub const THREAD_STACK: usize = 256 * 1024 * 1024;
pub use server::{Config, KubeEmulator, kubeconfig_yaml};

use server::Shared;
