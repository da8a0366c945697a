package kube

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Agents listen on the pod network, so each answers only requests that
// carry its sandbox's token. The token is HMAC-SHA256(key, sandbox id),
// the key a Secret of the namespace that only the server reads (sandbox
// pods mount no service-account token). The pod spec carries only the
// token's SHA-256 (the agent's --token-sha256): whoever reads pod specs
// learns no token. Deriving the token, instead of storing one per
// sandbox, keeps the lifecycle at two API writes (no Secret per sandbox,
// no handshake to race) and lets every replica and a restarted server
// reach every agent.

// KeySecret is the Secret that holds the agents' token key.
const KeySecret = "orchard-agent-key"

const keyField = "key"

// agentKey reads the namespace's token key, creating it on first start.
func agentKey(ctx context.Context, cs kubernetes.Interface, ns string) ([]byte, error) {
	secrets := cs.CoreV1().Secrets(ns)
	for range 3 {
		s, err := secrets.Get(ctx, KeySecret, metav1.GetOptions{})
		if err == nil {
			if k := s.Data[keyField]; len(k) >= 32 {
				return k, nil
			}
			return nil, fmt.Errorf("kube runtime: secret %s/%s has no %q of 32 bytes or more", ns, KeySecret, keyField)
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("kube runtime: read secret %s/%s: %w", ns, KeySecret, err)
		}
		key := make([]byte, 32)
		rand.Read(key)
		_, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: KeySecret, Labels: map[string]string{LabelManagedBy: ManagedBy}},
			Data:       map[string][]byte{keyField: key},
		}, metav1.CreateOptions{})
		if err == nil {
			return key, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("kube runtime: create secret %s/%s: %w", ns, KeySecret, err)
		}
		// Another replica made it first: read theirs.
	}
	return nil, fmt.Errorf("kube runtime: secret %s/%s: gave up", ns, KeySecret)
}

// token is the bearer token of sandbox id's agent.
func (r *Runtime) token(id string) string {
	m := hmac.New(sha256.New, r.key)
	m.Write([]byte(id))
	return hex.EncodeToString(m.Sum(nil))
}

func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// agentAddr is how agentclient reaches sandbox id's agent at ip: the token
// travels as the URL's password and is sent as a bearer token.
func (r *Runtime) agentAddr(id, ip string) string {
	return "http://orchard:" + r.token(id) + "@" + net.JoinHostPort(ip, strconv.Itoa(r.cfg.AgentPort))
}
