"""Names that make Respawn wire-compatible with the upstream AppWrapper API (v1beta2).

Every string here is part of a contract with something outside Respawn: the CRD that users
already apply, Kueue's built-in AppWrapper integration, dashboards that read condition
reasons, and kube-state-metrics configurations. They must match upstream byte for byte, so
they live in one module and are never spelled out anywhere else.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

GROUP: Final = "workload.codeflare.dev"
VERSION: Final = "v1beta2"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "AppWrapper"
LIST_KIND: Final = "AppWrapperList"
PLURAL: Final = "appwrappers"
SINGULAR: Final = "appwrapper"
SHORT_NAME: Final = "aw"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

# Put on every wrapped resource and every pod template; its value is the AppWrapper's name.
# Pods are found (and counted) through this label, so it is also the pod selector.
APPWRAPPER_LABEL: Final = f"{GROUP}/appwrapper"
FINALIZER: Final = f"{GROUP}/finalizer"
# The value of spec.managedBy that means "this controller"; any other value means hands off
# (MultiKueue sets it so that the copy on the manager cluster is left alone).
CONTROLLER_NAME: Final = f"{GROUP}/appwrapper-controller"

# Set at creation from the requesting user (sanitised to label syntax) and immutable after.
USER_LABEL: Final = f"{GROUP}/user"
USER_ID_LABEL: Final = f"{GROUP}/userid"

# Kueue's local-queue label.
QUEUE_NAME_LABEL: Final = "kueue.x-k8s.io/queue-name"

# Upstream's annotation domain for per-AppWrapper parameters. Note the ".appwrapper" suffix on
# the domain: it differs from GROUP on purpose upstream. The individual keys live in
# shared.appwrapper.params.
ANNOTATION_PREFIX: Final = f"{GROUP}.appwrapper/"

# Our own extensions (labels and annotations that upstream does not define) use this prefix so
# that they never collide with, or change the meaning of, an upstream key.
RESPAWN_PREFIX: Final = "respawn.dev/"

# On the AppWrapper: the transition (phase, attempt, time; see services/lifecycle/announcements.py)
# whose announcements (lifecycle-stream messages and Kubernetes Events) have all been sent. A
# status whose transition differs has announcements owed, which a later pass re-sends.
ANNOUNCED_ANNOTATION: Final = f"{RESPAWN_PREFIX}announced"

# On the AppWrapper while a reset is under way: the W3C traceparent of the incident's trace
# (services/lifecycle/incidents.py). Every later pass of the reset, in whichever lifecycle
# process, continues that trace, so one incident is one trace even across a restart.
INCIDENT_TRACE_ANNOTATION: Final = f"{RESPAWN_PREFIX}incident-trace"

# On every wrapped resource lifecycle creates: "<AppWrapper uid>/<attempt>/<component index>",
# the attempt being when its resources began to be deployed (compact UTC). A component created
# under a generated name is found (adopted) by it if the name never made it into the status,
# instead of being created a second time. (An annotation, not a label: the objects are listed by
# the AppWrapper label already, and the rendered object's labels stay as upstream's.)
COMPONENT_ANNOTATION: Final = f"{RESPAWN_PREFIX}component"

# On every pod template lifecycle renders: the attempt the pods belong to ("1", "2", ...; it
# counts every reset, see status.attempt) and the pod set they belong to (its index among all the
# AppWrapper's pod sets, in component order). Health judges a completion policy by the latter.
ATTEMPT_LABEL: Final = f"{RESPAWN_PREFIX}attempt"
POD_SET_LABEL: Final = f"{RESPAWN_PREFIX}pod-set"

# On the AppWrapper: "true" asks Respawn to stop the workload (delete everything, end Failed with
# reason Stopped, retry nothing). docs/lifecycle.md, "Stopping a workload".
STOP_ANNOTATION: Final = f"{RESPAWN_PREFIX}stop"

# On the AppWrapper: per pod set, how many succeeded pods make the workload succeed and how many
# failed pods make it fail (shared/appwrapper/completion.py).
COMPLETION_POLICY_ANNOTATION: Final = f"{RESPAWN_PREFIX}completion-policy"

# Kueue caps a workload at this many pod sets, so an AppWrapper may not have more.
MAX_POD_SETS: Final = 8


class Phase(StrEnum):
    """status.phase. A freshly created AppWrapper has no phase (the empty string)."""

    EMPTY = ""
    SUSPENDED = "Suspended"
    RESUMING = "Resuming"
    RUNNING = "Running"
    RESETTING = "Resetting"
    SUSPENDING = "Suspending"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    TERMINATING = "Terminating"


class ConditionType(StrEnum):
    QUOTA_RESERVED = "QuotaReserved"
    RESOURCES_DEPLOYED = "ResourcesDeployed"
    PODS_READY = "PodsReady"
    UNHEALTHY = "Unhealthy"
    DELETING_RESOURCES = "DeletingResources"


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Reason(StrEnum):
    """Condition reasons written on the AppWrapper, exactly as upstream writes them.

    Several reasons are simply the name of the phase being entered (Resuming, Suspended, ...);
    they are listed once.
    """

    # Phase-named reasons, used on QuotaReserved / ResourcesDeployed / PodsReady / Unhealthy.
    RESUMING = "Resuming"
    SUSPENDED = "Suspended"
    RESETTING = "Resetting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    TERMINATING = "Terminating"
    # PodsReady
    SUFFICIENT_PODS_READY = "SufficientPodsReady"
    INSUFFICIENT_PODS_READY = "InsufficientPodsReady"
    # Unhealthy (True): why the workload was judged unhealthy.
    CREATE_FAILED = "CreateFailed"
    MISSING_COMPONENT = "MissingComponent"
    FAILED_COMPONENT = "FailedComponent"
    FOUND_FAILED_PODS = "FoundFailedPods"
    AUTOPILOT_NO_EXECUTE = "AutopilotNoExecute"
    # Unhealthy (False) once a Running check finds nothing wrong.
    FOUND_NO_FAILED_PODS = "FoundNoFailedPods"
    # DeletingResources
    DELETION_INITIATED = "DeletionInitiated"
    DELETION_COMPLETE = "DeletionComplete"
    DELETION_PAUSED = "DeletionPaused"
    # Failed because the respawn.dev/stop annotation asked for it (a Respawn addition).
    STOPPED = "Stopped"


class ComponentReason(StrEnum):
    """Reasons on status.componentStatus[i].conditions (type ResourcesDeployed only)."""

    CREATION_INITIATED = "ComponentCreationInitiated"
    CREATED_SUCCESSFULLY = "ComponentCreatedSuccessfully"
    CREATION_ERRORED = "ComponentCreationErrored"
    # Misspelt upstream; kept as is because clients match on the exact string.
    DELETED = "CompononetDeleted"


class EventReason(StrEnum):
    """Reasons of the (Normal) Kubernetes events recorded on an AppWrapper."""

    SUSPENDING = "Suspending"
    UNHEALTHY = "Unhealthy"


# Condition messages that carry no variable part; several clients display them verbatim.
MSG_SUSPEND_FALSE: Final = "Suspend is false"
MSG_SUSPEND_TRUE: Final = "Suspend is true"
MSG_RESET_COMPLETE: Final = "Reset complete; resuming"
MSG_NO_RESOURCES_DEPLOYED: Final = "No resources deployed"
MSG_RESOURCES_DELETED_RESETTING: Final = "Resources deleted for resetting AppWrapper"
MSG_RESOURCES_DELETED_FAILED: Final = "Resources deleted for failed AppWrapper"
MSG_KUEUE_FORCED_DELETION: Final = "Kueue forced resource deletion by suspending AppWrapper"
MSG_RESOURCES_DELETED: Final = "Resources successfully deleted"

# Pod-set annotations that tell Kueue's topology-aware scheduling which pod label carries a
# pod's index (and, for JobSets, which label carries the replicated-job index and how many
# replicated jobs there are). Values are label keys owned by the batch and JobSet APIs.
TAS_POD_INDEX_LABEL_ANNOTATION: Final = f"{ANNOTATION_PREFIX}tas-pod-index-label"
TAS_SUB_GROUP_INDEX_LABEL_ANNOTATION: Final = f"{ANNOTATION_PREFIX}tas-sub-group-index-label"
TAS_SUB_GROUP_COUNT_ANNOTATION: Final = f"{ANNOTATION_PREFIX}tas-sub-group-count"
JOB_COMPLETION_INDEX_ANNOTATION: Final = "batch.kubernetes.io/job-completion-index"
JOBSET_JOB_INDEX_LABEL: Final = "jobset.sigs.k8s.io/job-index"
