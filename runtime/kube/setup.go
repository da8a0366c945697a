package kube

import (
	"context"
	"fmt"
	"reflect"
	"strings"

	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// Names of the namespace's network policies.
const (
	PolicyDenyAll     = "orchard-deny-all"
	PolicyAgentAccess = "orchard-agent-access"
)

func checkNamespace(ctx context.Context, cs kubernetes.Interface, ns string) error {
	_, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("kube runtime: namespace %q does not exist: create it (kubectl create namespace %s) or set --kube-namespace", ns, ns)
	case apierrors.IsForbidden(err):
		// Reading namespaces is not needed to run; the access review
		// below names what is.
		return nil
	case err != nil:
		return fmt.Errorf("kube runtime: read namespace %q: %w", ns, err)
	}
	return nil
}

// needed are the calls the runtime makes, checked at start-up so that a
// missing RBAC rule is a clear error then instead of a failed sandbox later.
var needed = []struct{ group, resource, verb string }{
	{"", "pods", "create"}, {"", "pods", "delete"}, {"", "pods", "get"}, {"", "pods", "list"}, {"", "pods", "watch"},
	{"", "secrets", "get"}, {"", "secrets", "create"},
	{"networking.k8s.io", "networkpolicies", "get"}, {"networking.k8s.io", "networkpolicies", "create"},
	{"networking.k8s.io", "networkpolicies", "update"}, {"networking.k8s.io", "networkpolicies", "delete"},
}

func checkAccess(ctx context.Context, cs kubernetes.Interface, ns string) error {
	var missing []string
	for _, n := range needed {
		rev, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{
			Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authzv1.ResourceAttributes{
				Namespace: ns, Group: n.group, Resource: n.resource, Verb: n.verb}},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("kube runtime: check permissions: %w", err)
		}
		if !rev.Status.Allowed {
			res := n.resource
			if n.group != "" {
				res += "." + n.group
			}
			missing = append(missing, n.verb+" "+res)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("kube runtime: RBAC forbids the server in namespace %q: %s (grant them with a Role bound to its service account; the Helm chart's role does)",
			ns, strings.Join(missing, ", "))
	}
	return nil
}

// ensurePolicies makes the namespace's two network policies: sandbox pods
// get no traffic in or out, but for the server's pods reaching the agent's
// port. (They need a CNI that enforces policies.)
func ensurePolicies(ctx context.Context, cs kubernetes.Interface, cfg Config) error {
	port := intstr.FromInt32(int32(cfg.AgentPort))
	tcp := corev1.ProtocolTCP
	for _, p := range []*netv1.NetworkPolicy{
		{
			ObjectMeta: metav1.ObjectMeta{Name: PolicyDenyAll, Labels: map[string]string{LabelManagedBy: ManagedBy}},
			Spec: netv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{},
				PolicyTypes: []netv1.PolicyType{netv1.PolicyTypeIngress, netv1.PolicyTypeEgress}},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: PolicyAgentAccess, Labels: map[string]string{LabelManagedBy: ManagedBy}},
			Spec: netv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelManagedBy: ManagedBy}},
				PolicyTypes: []netv1.PolicyType{netv1.PolicyTypeIngress},
				Ingress: []netv1.NetworkPolicyIngressRule{{
					From: []netv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{},
						PodSelector: &metav1.LabelSelector{MatchLabels: cfg.ServerPods}}},
					Ports: []netv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
				}},
			},
		},
	} {
		if err := applyPolicy(ctx, cs, cfg, p); err != nil {
			return err
		}
	}
	return nil
}

// applyPolicy creates p, or updates it when it differs.
func applyPolicy(ctx context.Context, cs kubernetes.Interface, cfg Config, p *netv1.NetworkPolicy) error {
	api := cs.NetworkingV1().NetworkPolicies(cfg.Namespace)
	err := callAPI(ctx, cfg.API, func(ctx context.Context) error {
		cur, err := api.Get(ctx, p.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = api.Create(ctx, p, metav1.CreateOptions{})
			return err
		}
		if err != nil || reflect.DeepEqual(cur.Spec, p.Spec) {
			return err
		}
		cur.Spec = p.Spec
		_, err = api.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("kube runtime: network policy %s/%s: %w", cfg.Namespace, p.Name, err)
	}
	return nil
}

// privateRanges are what a full-egress sandbox may not reach: private,
// shared, link-local (cloud metadata) and loopback addresses, where the
// cluster's own pods and services live.
var privateRanges = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8"}

func egressPolicyName(id string) string { return "sandbox-" + id + "-egress" }

// createEgressPolicy lets sandbox id's pod reach the internet directly
// (egress mode full): any public address, and DNS.
func (r *Runtime) createEgressPolicy(ctx context.Context, id string) error {
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	dns := intstr.FromInt32(53)
	p := &netv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: egressPolicyName(id),
			Labels: map[string]string{LabelManagedBy: ManagedBy, LabelSandbox: id}},
		Spec: netv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelSandbox: id}},
			PolicyTypes: []netv1.PolicyType{netv1.PolicyTypeEgress},
			Egress: []netv1.NetworkPolicyEgressRule{
				{To: []netv1.NetworkPolicyPeer{{IPBlock: &netv1.IPBlock{CIDR: "0.0.0.0/0", Except: privateRanges}}}},
				{To: []netv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}},
					Ports: []netv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns}}},
			},
		},
	}
	err := callAPI(ctx, r.cfg.API, func(ctx context.Context) error {
		_, err := r.cs.NetworkingV1().NetworkPolicies(r.cfg.Namespace).Create(ctx, p, metav1.CreateOptions{})
		return err
	})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return apiFault(err, "create network policy "+p.Name)
	}
	return nil
}

func (r *Runtime) deleteEgressPolicy(ctx context.Context, id string) {
	err := callAPI(ctx, r.cfg.API, func(ctx context.Context) error {
		return r.cs.NetworkingV1().NetworkPolicies(r.cfg.Namespace).Delete(ctx, egressPolicyName(id), metav1.DeleteOptions{})
	})
	if err != nil && !apierrors.IsNotFound(err) {
		r.cfg.Log.Warn("delete egress policy", "sandbox_id", id, "err", err)
	}
}
